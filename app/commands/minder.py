"""``rankwatch minder train|eval|detect``: Minder's offline training, study and detection.

Training needs torch (the ``torch`` extra); detection with a trained model does not.
The data format is that of ``../shared/data/asd/``: one ``*.npz`` per server (any
names; ASD's are ``omi-*``) with
``train`` [T, K], ``test`` [T, K] and (for eval) ``test_label`` [T].
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

DESCRIPTION = """\
train:  train the per-metric LSTM-VAE denoisers on the train split of every *.npz
        in DIR and write the model (numpy arrays, thresholds from the train split;
        with --labels, the metric priority from the test split's labelled windows).
eval:   the nested protocol (docs/minder.md): each server held out once, the default
        detector's and the Mahalanobis baseline's settings picked on the other servers'
        labels; window F1, false alarms per machine-day and their differences with 95%
        intervals. No torch needed. --paper: the paper's Minder and its ablations
        (trains the denoisers); --holdout/--rotate: the paper's variants held out.
detect: run a trained model on the test split of DIR and list the machines reported.
worker: the stream worker: <prefix>.metrics in, machine_scores / machine_faults rows
        and one faulty_machine alert per episode on <prefix>.alerts out."""


def register(subparsers: Any) -> None:
    from rankwatch.config import SCORINGS

    parser = subparsers.add_parser(
        "minder",
        help="faulty-machine detector: train, evaluate, detect",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    train = sub.add_parser("train", help="train the denoisers on DIR's train split")
    train.add_argument("dir", type=Path, metavar="DIR")
    train.add_argument("--out", type=Path, required=True, metavar="MODEL.npz")
    train.add_argument("--quantile", type=float, default=0.95)
    train.add_argument(
        "--labels",
        action="store_true",
        help="learn the metric priority from the test split's labels (the labels of the data "
        "detect would then score: only for a model meant for other machines); default: none",
    )
    evaluate = sub.add_parser("eval", help="train and score Minder against the baseline")
    evaluate.add_argument("dir", type=Path, metavar="DIR")
    evaluate.add_argument("--format", choices=("text", "json"), default="text")
    evaluate.add_argument(
        "--paper",
        action="store_true",
        help="the paper's Minder (denoisers, metric priority) and its ablations against the "
        "baseline, one server left out (trains; needs torch); --holdout and --rotate list "
        "the paper's Minder beside the default anyway",
    )
    evaluate.add_argument(
        "--holdout",
        default="",
        metavar="SERVER,...",
        help="score only these servers, with every setting chosen on the others' labels",
    )
    evaluate.add_argument(
        "--rotate",
        action="store_true",
        help="hold out each server in turn (settings chosen on the others), pool the results",
    )
    evaluate.add_argument(
        "--fa-budget",
        type=float,
        metavar="PER_MACHINE_DAY",
        help="with --holdout/--rotate: pick each detector's settings by the labelled segments "
        "they find on the development servers, among those raising at most this many false "
        "alarms per machine-day there (default: by window F1)",
    )
    evaluate.add_argument(
        "--live",
        action="store_true",
        help="with --holdout/--rotate: also replay the group through the live monitor "
        "(residual scoring with baselines learnt from the stream, and pairwise scoring) "
        "and score it like the others",
    )
    evaluate.add_argument(
        "--minutes-per-point", type=float, default=5.0, help="sampling step (ASD: 5 minutes)"
    )
    detect = sub.add_parser("detect", help="detect on DIR's test split with a trained model")
    detect.add_argument("dir", type=Path, metavar="DIR")
    detect.add_argument("--model", type=Path, metavar="MODEL.npz", help="required without --live")
    detect.add_argument("--continuity", type=int, default=2)
    detect.add_argument(
        "--live",
        action="store_true",
        help="replay DIR through the live monitor as the worker runs it (the train split as "
        "the stream's history, then the test split; residual scoring, baselines learnt from "
        "the stream) and list the windows it reports",
    )
    detect.add_argument(
        "--threshold", type=float, default=3.0, help="with --live: the fused threshold"
    )
    worker = sub.add_parser("worker", help="run the Minder stream worker (faust)")
    worker.add_argument("--config", help="TOML config file (see README)")
    worker.add_argument("--kafka", help="bootstrap servers (overrides config and env)")
    worker.add_argument("--clickhouse", help="ClickHouse DSN (overrides config and env)")
    worker.add_argument("--model", help="MODEL.npz from `minder train` ([minder] model)")
    worker.add_argument("--window", type=int, metavar="SECONDS", help="[minder] window_s")
    worker.add_argument("--continuity", type=int, metavar="WINDOWS", help="[minder] continuity")
    worker.add_argument("--threshold", type=float, help="[minder] threshold")
    worker.add_argument(
        "--scoring",
        choices=SCORINGS,
        help="[minder] scoring (docs/minder.md)",
    )
    worker.add_argument(
        "--status-file", help="health file written every tick ([minder] status_file)"
    )
    worker.add_argument("--loglevel", default="info")
    for p in (train, evaluate):
        p.add_argument("--epochs", type=int, default=5)
        p.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankwatch.errors import UserError

    if args.action == "worker":
        return _worker(args)
    if not args.dir.is_dir() or not any(args.dir.glob("*.npz")):
        raise UserError(f"{args.dir}: no *.npz server files there")
    return {"train": _train, "eval": _eval, "detect": _detect}[args.action](args)


def _train_config(args: argparse.Namespace) -> Any:
    from rankwatch.errors import UserError

    try:
        from rankwatch.streams.minder.train import TrainConfig
    except ImportError as exc:
        raise UserError(f"training needs torch (pip install 'rankwatch[torch]'): {exc}") from exc
    return TrainConfig(epochs=args.epochs, seed=args.seed)


def _train(args: argparse.Namespace) -> int:
    from dataclasses import replace

    import numpy as np

    from rankwatch.errors import UserError
    from rankwatch.streams.minder import MinderConfig, calibrate_thresholds, metric_scores
    from rankwatch.streams.minder.evaluation import window_labels
    from rankwatch.streams.minder.priority import max_z_features, rank_metrics
    from rankwatch.streams.minder.serial import model_to_arrays
    from rankwatch.streams.minder.similarity import window_starts
    from rankwatch.streams.minder.train import train_model

    cfg = _train_config(args)
    group, names = _load(args.dir)
    model = train_model(group.train_MTK, group.metrics, cfg)
    config = MinderConfig(window=cfg.window, stride=cfg.window // 2)
    scores = metric_scores(group.train_MTK, model, config)
    model = replace(model, thresholds=calibrate_thresholds(scores, group.metrics, args.quantile))
    if args.labels and not group.label_MT.any():
        raise UserError(f"--labels: {args.dir} has no labelled test points")
    if args.labels:  # labelled windows: learn the metric priority from them
        starts = window_starts(group.test_MTK.shape[1], config.window, config.stride)
        faulty = np.asarray(window_labels(group.label_MT, starts, config.window).any(axis=1))
        order = rank_metrics(max_z_features(group.test_MTK, starts, config.window), faulty)
        model = replace(model, priority=tuple(group.metrics[k] for k in order))
        print(f"metric priority from the test split's labels: {', '.join(model.priority[:5])}")
    save: Any = np.savez  # numpy's stub types **arrays as the allow_pickle flag
    save(args.out, **model_to_arrays(model))
    print(f"trained {len(group.metrics)} denoisers on {len(names)} servers -> {args.out}")
    return 0


def _load(directory: Path) -> Any:
    from rankwatch.errors import UserError
    from rankwatch.streams.minder.files import GroupFileError, load_group

    try:
        return load_group(directory)
    except GroupFileError as exc:
        raise UserError(str(exc)) from exc


def _eval(args: argparse.Namespace) -> int:
    import orjson

    from rankwatch.errors import UserError
    from rankwatch.streams.minder.files import GroupFileError
    from rankwatch.streams.minder.train import evaluate_dir

    if args.holdout and args.rotate:
        raise UserError("--holdout and --rotate exclude each other")
    held_out = bool(args.holdout or args.rotate)
    if (args.fa_budget is not None or args.live) and not held_out:
        raise UserError(
            "--fa-budget and --live pick settings on development servers: add --holdout or --rotate"
        )
    if not (args.paper or held_out):
        return _nested(args)
    cfg = _train_config(args)
    if held_out:
        return _holdout(args, cfg)
    try:
        out = evaluate_dir(args.dir, cfg)
    except GroupFileError as exc:
        raise UserError(str(exc)) from exc
    if args.format == "json":
        print(orjson.dumps(out).decode())
        return 0
    for name in ("minder", "baseline", *out["ablations"]):
        r = out.get(name) or out["ablations"][name]
        print(
            f"{name:26s} precision {r['precision']:.3f}  recall {r['recall']:.3f}  "
            f"f1 {r['f1']:.3f}  delay {r['mean_delay_points']} points"
        )
    return 0


def _nested(args: argparse.Namespace) -> int:
    """The default detector against the baseline, nested (``streams/minder/nested.py``)."""
    import orjson

    from rankwatch.errors import UserError
    from rankwatch.streams.minder.nested import nested_study

    group, names = _load(args.dir)
    try:
        out = nested_study(group, points_per_day=24 * 60 / args.minutes_per_point)
    except ValueError as exc:
        raise UserError(f"{args.dir}: {exc}") from exc
    out["servers"] = names
    if args.format == "json":
        print(orjson.dumps(out).decode())
        return 0
    print(f"{len(names)} servers, each held out once (settings picked on the others' labels)")
    for name in ("default", "baseline"):
        r = out[name]
        print(
            f"{name:9s} window F1 {r['window_f1']:.3f} (P {r['window_precision']:.3f} "
            f"R {r['window_recall']:.3f})  segments {r['segments_detected']}/{r['segments']}  "
            f"detect median {r['detect_minutes_median']} min  "
            f"false alarms/machine-day {r['false_alarms_per_machine_day']}"
        )
    c = out["default_vs_baseline"]
    print("default - baseline (95% intervals, paired bootstrap over server-days):")
    for key, label in (
        ("window_f1", "window F1"),
        ("false_alarms_per_machine_day", "false alarms/machine-day"),
        ("segments_detected", "segments"),
        ("detect_minutes_median", "median minutes"),
    ):
        d = c[key]
        print(f"  {label:25s} {d['difference']:+g} [{d['ci95'][0]:+g}, {d['ci95'][1]:+g}]")
    peers = out["peer_metrics"]
    print(
        f"peer metrics ({len(peers)} of {len(group.metrics)}, in the history and the test "
        f"split): {', '.join(peers) or 'none'}" + ("" if peers else " (own history alone)")
    )
    return 0


def _holdout(args: argparse.Namespace, cfg: Any) -> int:
    import orjson

    from rankwatch.errors import UserError
    from rankwatch.streams.minder.files import GroupFileError
    from rankwatch.streams.minder.train import holdout_dir, rotation_dir

    held = [s.strip() for s in args.holdout.split(",") if s.strip()]
    try:
        if args.rotate:
            out = rotation_dir(args.dir, cfg, args.minutes_per_point, args.fa_budget, args.live)
        else:
            out = holdout_dir(
                args.dir, held, cfg, args.minutes_per_point, args.fa_budget, args.live
            )
    except GroupFileError as exc:
        raise UserError(str(exc)) from exc
    if args.format == "json":
        print(orjson.dumps(out).decode())
        return 0
    print(f"held out: {', '.join(out['held_out_servers'])} (settings chosen on the others)")
    if args.rotate:
        print("(each in turn; the held-out results of the folds pooled)")
    if args.fa_budget is not None:
        print(
            "settings: most segments found on the development servers with at most "
            f"{args.fa_budget:g} false alarms per machine-day there"
        )
    for name in (
        "minder", "minder_peer", "minder_fused", "minder_live", "minder_live_pairwise", "default",
        "baseline"
    ):  # fmt: skip
        if name not in out:
            continue
        r = out[name]["held_out"]
        print(
            f"{name:20s} window F1 {r['window_f1']:.3f}  point F1 {r['point_f1']:.3f}  "
            f"segments {r['segments_detected']}/{r['segments']}  "
            f"detect median {r['detect_minutes_median']} min  "
            f"false alarms/machine-day {r['false_alarms_per_machine_day']}"
        )
    print("differences (95% intervals, paired bootstrap over server-days):")
    for pair, c in out["comparisons"].items():
        parts = [
            f"{label} {c[key]['difference']:+g} [{c[key]['ci95'][0]:+g}, {c[key]['ci95'][1]:+g}]"
            for key, label in (
                ("window_f1", "window F1"),
                ("segments_detected", "segments"),
                ("detect_minutes_median", "median minutes"),
                ("false_alarms_per_machine_day", "false alarms/machine-day"),
            )
            if key in c
        ]
        verdict = "clear on all three" if c["clear_on_all_three"] else "not clear on all three"
        print(f"  {pair:36s} {'; '.join(parts)} ({verdict})")
    return 0


def _detect(args: argparse.Namespace) -> int:
    from dataclasses import replace

    import numpy as np

    from rankwatch.errors import UserError
    from rankwatch.streams.minder import MinderConfig, detect
    from rankwatch.streams.minder.serial import model_from_arrays

    if args.live:
        return _detect_live(args)
    if args.model is None:
        raise UserError("detect needs --model MODEL.npz (or --live)")
    try:
        model = model_from_arrays(dict(np.load(args.model, allow_pickle=False)))
    except (OSError, KeyError, ValueError) as exc:
        raise UserError(f"cannot read model {args.model}: {exc}") from exc
    group, names = _load(args.dir)
    window = next(iter(model.denoisers.values())).window if model.denoisers else 8
    config = replace(MinderConfig(window=window, stride=window // 2), continuity=args.continuity)
    det = detect(group.test_MTK, model, config)
    for n, m in zip(*np.nonzero(det.confirmed_NM), strict=True):
        start = int(det.starts[n])
        metric = model.metrics[int(det.metric_N[n])]
        print(f"{names[m]}\tpoints {start}-{start + window - 1}\tmetric {metric}")
    return 0


def _detect_live(args: argparse.Namespace) -> int:
    """The live monitor replayed over DIR (``streams/minder/replay.py``)."""
    import numpy as np

    from rankwatch.streams.minder.online import OnlineConfig
    from rankwatch.streams.minder.replay import replay_group
    from rankwatch.streams.minder.similarity import window_starts

    group, names = _load(args.dir)
    window, stride = 8, 4  # as the offline study: 8 points, every 4
    config = OnlineConfig(threshold=args.threshold, continuity=args.continuity, scoring="residual")
    reported = replay_group(group, names, config, window, stride)
    starts = window_starts(group.test_MTK.shape[1], window, stride)
    for n, m in zip(*np.nonzero(reported), strict=True):
        start = int(starts[n])
        print(f"{names[m]}\tpoints {start}-{start + window - 1}\tlive residual")
    return 0


def _worker(args: argparse.Namespace) -> int:
    from rankwatch.config import load_config, service_settings, with_flags
    from rankwatch.errors import UserError
    from rankwatch.streams.kit.faustapp import serve
    from rankwatch.streams.minder.online import OnlineConfig
    from rankwatch.streams.minder.worker import MinderSettings, build_minder_app, model_refusal
    from rankwatch.topics import make_topics

    flags = {
        "kafka.bootstrap": args.kafka,
        "clickhouse.dsn": args.clickhouse,
        "minder.model": args.model,
        "minder.window_s": args.window,
        "minder.continuity": args.continuity,
        "minder.threshold": args.threshold,
        "minder.scoring": args.scoring,
        "minder.status_file": args.status_file,
    }
    config = with_flags(load_config(args.config), flags)
    minder = config.minder
    refusal = model_refusal(minder.model)
    if refusal:
        raise UserError(refusal)
    settings = MinderSettings(
        **service_settings(config, "-minder"),
        status_file=minder.status_file or None,
        retire_after_s=minder.retire_after_s,
        online=OnlineConfig(
            window_s=minder.window_s,
            stride_s=minder.window_s,
            continuity=minder.continuity,
            threshold=minder.threshold,
            scoring=minder.scoring,
        ),
        model_path=minder.model,
    )
    prefix = settings.topic_prefix
    report = make_topics(
        config.kafka, [f"{prefix}.{kind}" for kind in ("metrics", "alerts", "dead-letters")]
    )
    app, state = build_minder_app(settings)
    state.topics = dict(report.partitions)
    serve(app, args.loglevel, settings.stop_wait_s)
    return 0
