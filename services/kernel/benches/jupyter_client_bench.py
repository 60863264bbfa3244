"""Baseline for the kernel bench: jupyter_client's blocking client running
`1+1` on an ipykernel (waits for the execute_reply and the iopub idle, as
omicos does). Prints one JSON line: {"transport", "p50_ms", "p99_ms", "n"}."""
import json, statistics, sys, time

from jupyter_client.manager import KernelManager

transport = sys.argv[1] if len(sys.argv) > 1 else "tcp"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
km = KernelManager(transport=transport)
km.start_kernel(extra_arguments=["--HistoryManager.enabled=False"])
kc = km.blocking_client()
kc.start_channels()
kc.wait_for_ready(timeout=60)
try:
    for _ in range(50):
        kc.execute_interactive("1+1", output_hook=lambda m: None, timeout=30)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        kc.execute_interactive("1+1", output_hook=lambda m: None, timeout=30)
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    print(json.dumps({"transport": transport, "p50_ms": statistics.median(times), "p99_ms": times[int(len(times) * 0.99) - 1], "n": n}))
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)
