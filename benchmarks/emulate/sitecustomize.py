"""Loaded by a peer's python under `--emulate` (benchmarks/emulation.py): makes `torch.cpu`
report the instruction sets of the kind in BENCH_EMULATE, as on such a CPU. vLLM reads these
to pick its kernels (AMX attention and linear layers, its AVX-512 or AVX2 library)."""

import os

_KIND = os.environ.get("BENCH_EMULATE")
if _KIND:
    import torch.cpu

    def _no() -> bool:
        return False

    _OFF = ["_is_amx_tile_supported", "_is_amx_fp16_supported"]
    if _KIND == "avx2":
        _OFF += ["_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported"]
    for _name in _OFF:
        if hasattr(torch.cpu, _name):
            setattr(torch.cpu, _name, _no)
