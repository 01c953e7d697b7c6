#!/bin/bash
# What a GPU call ran on, to $OUT/machine.txt: the GPU, the cores, the libraries' releases, the
# time. Sourced by the calls' scripts (first.sh, steady.sh) from the repository root.
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nproc --all
    python3 - <<'PY'
import torch, numpy, gymnasium, envpool, ale_py
print('torch', torch.__version__, 'numpy', numpy.__version__, 'gymnasium', gymnasium.__version__,
      'envpool', envpool.__version__, 'ale_py', ale_py.__version__)
PY
    date -u
} > $OUT/machine.txt 2>&1
