#!/usr/bin/env bash
# The end-to-end check of gpuckpt on a machine with an NVIDIA GPU (docs/GPU.md). It is a Python
# runner, one file per stage (scripts/gpu/check/); this keeps its command line:
#   scripts/gpu-check.sh --bundle gpu-bundle --budget-s 330    (--help: the options)
exec python3 "$(dirname "$0")/gpu/check/runner.py" "$@"
