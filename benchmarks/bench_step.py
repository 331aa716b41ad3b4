"""Time one decode step of the runner (not a test): `python benchmarks/bench_step.py`.

B requests decode one token each with `--context` tokens already cached. The KV content does not
matter for timing, so no prefill is run. A (B, hidden) x (vocab, hidden) matmul is timed in the
same run to show the machine's current matmul rate (other processes share the CPU) and the step
time that rate would give if the step were matmuls only (2 x params FLOP per token). A sum over
a 512 MB tensor, timed beside each step, gives the memory read rate now and so the time one pass
over the weights takes at it: the floor of a decode step at few rows, where every weight is
streamed from memory once per step.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from modelyard.build_tools import path_with_ninja
from modelyard.engine.config import CacheConfig, ModelConfig, kernels_from_environment
from modelyard.engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from modelyard.engine.sampling_params import SamplingParams
from modelyard.runner.loader import DEFAULT_MODEL
from modelyard.runner.model_runner import ModelRunner

STREAM_BYTES = 512 * 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    os.environ["PATH"] = path_with_ninja(os.environ)  # a first-use kernel build runs ninja
    block_size = 16
    per_req = (args.context + 1 + block_size - 1) // block_size
    runner = ModelRunner(
        ModelConfig(model=args.model, dtype=args.dtype, num_threads=args.threads),
        CacheConfig(block_size=block_size, num_blocks=args.batch * per_req + 1),
        kernels=kernels_from_environment(),
    )
    params = SamplingParams(temperature=0.0)
    tables = [list(range(1 + i * per_req, 1 + (i + 1) * per_req)) for i in range(args.batch)]
    batch = SchedulerOutput(
        [
            ScheduledRequest(f"r{i}", [5], args.context, tables[i], True, params, [5], [])
            for i in range(args.batch)
        ],
        args.batch,
    )
    config = runner.resolved.config
    x = torch.randn(args.batch, config.hidden_size, dtype=runner.dtype)
    w = torch.randn(config.vocab_size, config.hidden_size, dtype=runner.dtype)
    runner.execute(batch)
    stream = torch.ones(STREAM_BYTES // 4)  # float32, far past the caches
    steps, mms, reads = [], [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        runner.execute(batch)
        steps.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        torch.nn.functional.linear(x, w)
        mms.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        stream.sum()
        reads.append(time.perf_counter() - t0)
    gflops = 2 * x.shape[0] * w.shape[0] * w.shape[1] / min(mms) / 1e9
    params_count = sum(p.numel() for p in _weights(runner))
    ideal_ms = 2 * args.batch * params_count / (gflops * 1e9) * 1000
    step_ms = sorted(steps)[len(steps) // 2] * 1000
    read_gbs = STREAM_BYTES / sorted(reads)[len(reads) // 2] / 1e9
    weight_bytes = params_count * torch.empty((), dtype=runner.dtype).element_size()
    print(
        f"{args.dtype} batch={args.batch} context={args.context}: step median {step_ms:.1f} ms "
        f"({args.batch / step_ms * 1000:.0f} tok/s); matmul rate now {gflops:.0f} GFLOP/s; "
        f"matmul-only step at that rate {ideal_ms:.1f} ms; memory read rate now "
        f"{read_gbs:.1f} GB/s (a tensor sum): reading the weights once takes "
        f"{weight_bytes / read_gbs / 1e6:.1f} ms"
    )


def _weights(runner: ModelRunner) -> list[torch.Tensor]:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(runner.resolved.config)  # type: ignore[no-untyped-call]
    return list(model.parameters())


if __name__ == "__main__":
    main()
