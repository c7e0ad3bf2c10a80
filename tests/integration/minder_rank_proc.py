"""A stand-in training rank for the Minder fault-injection test (run as a process).

Every step: a fixed amount of Python compute, a fixed payload sent to the sink over
TCP (the "gradient exchange"), then sleep until the next step boundary. SIGUSR1 makes
it leak 4 MiB per step (a memory fault); SIGUSR2 frees the leak.
"""

from __future__ import annotations

import signal
import socket
import sys
import time

STEP_S = 0.25
WORK = 50_000
PAYLOAD = b"x" * 32_768
leak: list[bytearray] = []
leaking = False


def on_signal(signum: int, _frame: object) -> None:
    global leaking
    leaking = signum == signal.SIGUSR1
    if not leaking:
        leak.clear()


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    signal.signal(signal.SIGUSR1, on_signal)
    signal.signal(signal.SIGUSR2, on_signal)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sock = socket.create_connection((host, port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65_536)
    start = time.monotonic()
    step = 0
    while True:
        acc = 0
        for i in range(WORK):
            acc += i * i % 7
        sock.sendall(PAYLOAD)
        if leaking:
            leak.append(bytearray(4 << 20))
            leak[-1][::4096] = b"\x01" * len(leak[-1][::4096])
        step += 1
        time.sleep(max(0.0, start + step * STEP_S - time.monotonic()))


if __name__ == "__main__":
    main()
