#!/usr/bin/env bash
# Fetch or build what a run needs.
#   bash download.sh                     # embedded default, offline: check/build tiny-arith, write synthetic_arith
#   bash download.sh --rebuild-model     # re-run the tiny-arith pretraining recipe (~25 min on 2 cores)
#   bash download.sh --model HF_ID       # a real base model from the hub, into models/<name>
#   bash download.sh --dataset NAME      # gsm_symbolic | word_problems (generated offline) or gsm8k | finqa | hotpotqa (hub)
# Hub downloads fail within seconds, with a clear message, where the hub is unreachable.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/python ]; then
  echo "download.sh: .venv not found; run 'bash setup.sh' first" >&2
  exit 2
fi
exec .venv/bin/python -m utils.run.download "$@"
