"""Methods that live in one file each: utils/core/method_files.py says what a file declares, and
utils/train/method_variants.py calls its `variants` and `piece`."""
