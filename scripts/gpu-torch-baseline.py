"""Cross-check of the cuBLAS baseline of `anyshape gpu`: PyTorch's FP32 matmuls (which
pick among cuBLAS and cuBLASLt kernels themselves, TF32 off) on the issue's three
workloads, median of CUDA-event timed calls after a warm-up. Prints CSV:
workload,T,torch_ms. Usage: python3 scripts/gpu-torch-baseline.py [T ...]"""
import sys

import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def timed(fn, reps=50):
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    ts = [int(t) for t in sys.argv[1:]] or [1, 3, 8, 17, 32, 60, 64, 97, 128]
    dev = "cuda"
    print("workload,T,torch_ms")
    for t in ts:
        x, w = torch.randn(16 * t, 768, device=dev), torch.randn(768, 2304, device=dev)
        print(f"dense,{t},{timed(lambda: torch.mm(x, w)):.5f}")
        q, k = torch.randn(192, t, 64, device=dev), torch.randn(192, t, 64, device=dev)
        print(f"bmm_nt,{t},{timed(lambda: torch.bmm(q, k.transpose(1, 2))):.5f}")
        p, v = torch.randn(192, t, t, device=dev), torch.randn(192, t, 64, device=dev)
        print(f"bmm_nn,{t},{timed(lambda: torch.bmm(p, v)):.5f}")


if __name__ == "__main__":
    main()
