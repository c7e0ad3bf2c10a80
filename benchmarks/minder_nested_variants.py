"""How the default detector holds when the development group is cut up (``docs/minder.md``,
"The nested protocol"): the nested protocol of ``rankwatch minder eval`` on subsets of
the ASD development servers' metrics and servers, and on the group with its servers
shifted in time against each other so that they no longer move together.

    .venv/bin/python benchmarks/minder_nested_variants.py ../shared/data/asd

Every case uses only ``DIR``'s servers (the development servers); no other dataset is
read. Prints one line per case: the default's and the baseline's pooled held-out window
F1 and false alarms per machine-day, the F1 difference with its 95% interval, and how
many peer metrics the default found in the history and in the scored data. About 10 s, no torch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from rankwatch.streams.minder.files import load_group
from rankwatch.streams.minder.nested import nested_study
from rankwatch.streams.minder.study import Group


def subset(
    g: Group, servers: list[int] | None = None, metrics: list[int] | None = None, shift: int = 0
) -> Group:
    """Some servers and metrics of ``g``; with ``shift``, server i's test split (and its
    labels) rolled by i x shift points and its train split by 2 x i x shift."""
    ms = list(range(g.test_MTK.shape[0])) if servers is None else servers
    ks = list(range(len(g.metrics))) if metrics is None else metrics
    train, test, label = g.train_MTK[ms][:, :, ks], g.test_MTK[ms][:, :, ks], g.label_MT[ms]
    if shift:
        train = np.stack([np.roll(train[i], 2 * i * shift, axis=0) for i in range(len(ms))])
        test = np.stack([np.roll(test[i], i * shift, axis=0) for i in range(len(ms))])
        label = np.stack([np.roll(label[i], i * shift, axis=0) for i in range(len(ms))])
    return Group(tuple(g.metrics[k] for k in ks), train, test, label)


def cases(g: Group) -> dict[str, Group]:
    m, k = g.test_MTK.shape[0], len(g.metrics)
    half = m // 2
    return {
        "all": g,
        "first half of the metrics": subset(g, metrics=list(range(k // 2))),
        "second half of the metrics": subset(g, metrics=list(range(k // 2, k))),
        "every other metric": subset(g, metrics=list(range(0, k, 2))),
        "first half of the servers": subset(g, servers=list(range(half))),
        "second half of the servers": subset(g, servers=list(range(half, m))),
        "all servers but the first": subset(g, servers=list(range(1, m))),
        # 700 points (2.4 days; 124 points off the 288-point day in the test split,
        # 248 in the train split): the servers no longer move together in either split
        "servers shifted 700 points": subset(g, shift=700),
        # 1300 points: the train split's shift (2600) is 8 points off whole days, the
        # test split's is 148: peers agree in the history and not in the scored data
        "servers shifted 1300 points": subset(g, shift=1300),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path)
    group, _ = load_group(parser.parse_args().dir)
    for name, g in cases(group).items():
        out = nested_study(g)
        d, b = out["default"], out["baseline"]
        f1 = out["default_vs_baseline"]["window_f1"]
        print(
            f"{name:28s} default F1 {d['window_f1']:.3f} FA/md "
            f"{d['false_alarms_per_machine_day']:.2f} | baseline F1 {b['window_f1']:.3f} "
            f"FA/md {b['false_alarms_per_machine_day']:.2f} | F1 difference "
            f"{f1['difference']:+.3f} [{f1['ci95'][0]:+.3f}, {f1['ci95'][1]:+.3f}] | peer "
            f"metrics {len(out['peer_metrics_history'])} of {len(g.metrics)} in the history, "
            f"{len(out['peer_metrics'])} when scored"
        )


if __name__ == "__main__":
    main()
