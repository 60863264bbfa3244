"""Baseline for the kernel-path bench on the same ipykernel omicos talks to:
jupyter_client's blocking client connects to that kernel's connection file
(ipc sockets) and runs `1+1` the way omicos does (waits for the
execute_reply and the iopub idle). It takes rounds from stdin: each line is
a count n; it answers each with one JSON line {"ms": [n round trips]}.
An empty line or EOF ends it."""
import json, sys, time

from jupyter_client import BlockingKernelClient

kc = BlockingKernelClient(connection_file=sys.argv[1])
kc.load_connection_file()
kc.start_channels()
kc.wait_for_ready(timeout=60)
try:
    for _ in range(50):
        kc.execute_interactive("1+1", output_hook=lambda m: None, timeout=30)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            break
        times = []
        for _ in range(int(line)):
            t0 = time.perf_counter()
            kc.execute_interactive("1+1", output_hook=lambda m: None, timeout=30)
            times.append((time.perf_counter() - t0) * 1000)
        print(json.dumps({"ms": times}), flush=True)
finally:
    kc.stop_channels()
