"""A stand-in training rank for the Minder fault-injection test (run as a process).

Every step: a fixed amount of Python compute, a fixed payload sent to the sink over
TCP (the "gradient exchange"), then sleep until the next step boundary. SIGUSR1 makes
it leak 1 MiB per step (a memory fault); SIGUSR2 frees the leak.

The agent samples once a second, so each rank must look steady at that scale, as a
real rank's traffic does: small steps (16 a second, 8 KiB each, so one step more or
less in a second moves its rates by 6%, not by a quarter as four 32 KiB steps did),
each drawn afresh between 0.8 and 1.2 times the mean (on a schedule: a rank held back
catches up). A fixed step keeps a rank in step with everything periodic around it for
the whole run: a rank whose sends fall on the sampling instant sees its per-second
rates swing from one sample to the next while its peers' stay flat, and a rank whose
compute coincides with another process's (a second run of the test, say) is preempted
every step while its peers are not. Minder rightly reports either; jitter spreads such
coincidences over every rank alike.
"""

from __future__ import annotations

import random
import signal
import socket
import sys
import time

STEP_S = 0.0625
JITTER = 0.2
WORK = 12_500
PAYLOAD = b"x" * 8_192
LEAK = 1 << 20
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
    due = time.monotonic()
    while True:
        acc = 0
        for i in range(WORK):
            acc += i * i % 7
        sock.sendall(PAYLOAD)
        if leaking:
            leak.append(bytearray(LEAK))
            leak[-1][::4096] = b"\x01" * len(leak[-1][::4096])
        due += STEP_S * random.uniform(1 - JITTER, 1 + JITTER)
        time.sleep(max(0.0, due - time.monotonic()))


if __name__ == "__main__":
    main()
