"""The live monitor's blend scoring replayed over a labelled group, against the offline
default detector at the same settings (``docs/minder.md``, "The default detector, live").

    .venv/bin/python benchmarks/minder_live_replay.py ../shared/data/asd

The group is replayed through ``online.JobMonitor`` as the worker would see it
(``replay.replay_group``: the train split is the stream's history, no labels, then
the test split); the offline default is ``blend`` fit on the train split. Both at
quantile 0.95 (what every fold of ``minder eval`` picked) and each continuity of the
grid; window F1 (precision, recall), segments found and false alarms per machine-day,
scored over every server. No setting is chosen here. About 15 s a line, no torch.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np

from rankwatch.streams.minder.blend import blend_decide, blend_scores, fit_blend
from rankwatch.streams.minder.evaluation import event_scores, score
from rankwatch.streams.minder.files import load_group
from rankwatch.streams.minder.online import OnlineConfig
from rankwatch.streams.minder.replay import replay_group
from rankwatch.streams.minder.similarity import window_starts
from rankwatch.streams.minder.study import Group

WINDOW, STRIDE, QUANTILE = 8, 4, 0.95


def line(name: str, reported: np.ndarray, g: Group) -> str:
    starts = window_starts(g.test_MTK.shape[1], WINDOW, STRIDE)
    every = np.arange(g.test_MTK.shape[0])
    w = score(reported, g.label_MT, starts, WINDOW, every, g.present_MT)
    ev = event_scores(reported, g.label_MT, starts, WINDOW, every, g.present_MT, 288.0)
    e = ev.to_json(5.0)
    return (
        f"{name:28s} window F1 {w.f1:.3f} (P {w.precision:.3f} R {w.recall:.3f})  "
        f"segments {e['segments_detected']}/{e['segments']}  "
        f"false alarms/machine-day {e['false_alarms_per_machine_day']:.2f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--history", type=int, default=OnlineConfig.blend_history)
    a = p.parse_args()
    g, names = load_group(a.dir)
    fit = fit_blend(g.train_MTK, WINDOW, STRIDE)
    offline = blend_scores(fit, g.test_MTK, QUANTILE)
    live = OnlineConfig(scoring="blend", quantile=QUANTILE, blend_history=a.history)
    live = replace(live, min_machines=min(live.min_machines, len(names)))
    for c in (1, 2, 3):
        print(line(f"offline, continuity {c}", blend_decide(offline, c), g))
        reported = replay_group(g, names, replace(live, continuity=c), WINDOW, STRIDE)
        print(line(f"live (ring {a.history}), continuity {c}", reported, g), flush=True)


if __name__ == "__main__":
    main()
