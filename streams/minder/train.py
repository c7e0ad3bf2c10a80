"""Offline training of Minder's LSTM-VAE denoisers with torch, and the ASD study.

Imported only by ``rankwatch minder train|eval``: the stream worker runs the exported
weights in numpy (``rankwatch.streams.minder.vae``) and never needs torch. The
architecture here must match that forward pass: encoder LSTM -> latent mean and
log-variance -> decoder LSTM fed the latent at every step -> linear output.

Legend: B windows, L window length, I inputs (1 per metric, K for the joint model),
M machines, T points, K metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from rankwatch.streams.minder.detector import MinderModel
from rankwatch.streams.minder.vae import VaeWeights


@dataclass(frozen=True)
class TrainConfig:
    window: int = 8
    hidden: int = 4
    latent: int = 8
    epochs: int = 8
    batch: int = 256
    lr: float = 1e-2
    beta: float = 1e-3
    """Weight of the KL term: small, so that reconstructions stay close to the input."""
    stride: int = 2
    """Training windows start every ``stride`` points."""
    max_windows: int = 40_000
    seed: int = 0


class LstmVae(nn.Module):
    def __init__(self, inputs: int, hidden: int, latent: int) -> None:
        super().__init__()
        self.enc = nn.LSTM(inputs, hidden, batch_first=True)
        self.mu = nn.Linear(hidden, latent)
        self.logvar = nn.Linear(hidden, latent)
        self.dec = nn.LSTM(latent, hidden, batch_first=True)
        self.out = nn.Linear(hidden, inputs)

    def forward(self, x_BLI: torch.Tensor, sample: bool = True) -> tuple[torch.Tensor, ...]:
        _, (h, _) = self.enc(x_BLI)
        mu, logvar = self.mu(h[-1]), self.logvar(h[-1])
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if sample else mu
        y, _ = self.dec(z[:, None, :].expand(-1, x_BLI.shape[1], -1))
        return self.out(y), mu, logvar

    def export(self, window: int) -> VaeWeights:
        def a(t: torch.Tensor) -> NDArray[np.float32]:
            return t.detach().cpu().numpy().astype(np.float32)

        p = dict(self.named_parameters())
        names = {
            "enc_w_ih": "enc.weight_ih_l0",
            "enc_w_hh": "enc.weight_hh_l0",
            "mu_w": "mu.weight",
            "mu_b": "mu.bias",
            "dec_w_ih": "dec.weight_ih_l0",
            "dec_w_hh": "dec.weight_hh_l0",
            "out_w": "out.weight",
            "out_b": "out.bias",
        }
        arrays = {ours: a(p[theirs]) for ours, theirs in names.items()}
        arrays["enc_b"] = a(p["enc.bias_ih_l0"] + p["enc.bias_hh_l0"])
        arrays["dec_b"] = a(p["dec.bias_ih_l0"] + p["dec.bias_hh_l0"])
        return VaeWeights(window=window, arrays=arrays)


def training_windows(x_MTI: NDArray[np.floating], cfg: TrainConfig) -> NDArray[np.float32]:
    """(B, L, I) windows of every machine's series, subsampled to ``max_windows``; a
    window with a missing point (NaN: a late joiner, a gap) is left out."""
    _, t, i = x_MTI.shape
    starts = np.arange(0, t - cfg.window + 1, cfg.stride)
    idx = starts[:, None] + np.arange(cfg.window)
    w = np.asarray(x_MTI, dtype=np.float32)[:, idx].reshape(-1, cfg.window, i)
    w = w[~np.isnan(w).any(axis=(1, 2))]
    if w.shape[0] > cfg.max_windows:
        rng = np.random.default_rng(cfg.seed)
        w = w[rng.choice(w.shape[0], cfg.max_windows, replace=False)]
    return w


def train_vae(windows_BLI: NDArray[np.float32], cfg: TrainConfig) -> VaeWeights:
    torch.manual_seed(cfg.seed)
    model = LstmVae(windows_BLI.shape[2], cfg.hidden, cfg.latent)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    data = torch.from_numpy(windows_BLI)
    gen = torch.Generator().manual_seed(cfg.seed)
    for _ in range(cfg.epochs):
        for idx in torch.randperm(data.shape[0], generator=gen).split(cfg.batch):
            x = data[idx]
            y, mu, logvar = model(x)
            kl = -0.5 * torch.mean(1 + logvar - mu.pow(2) - logvar.exp())
            loss = torch.mean((y - x) ** 2) + cfg.beta * kl
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.export(cfg.window)


def train_model(
    train_MTK: NDArray[np.floating], metrics: tuple[str, ...], cfg: TrainConfig, joint: bool = False
) -> MinderModel:
    """One VAE per metric (Minder), or one VAE over all metrics (the ablation)."""
    torch.set_num_threads(1)
    if joint:
        weights = train_vae(training_windows(train_MTK, cfg), cfg)
        return MinderModel(metrics=metrics, joint=weights)
    denoisers = {
        name: train_vae(training_windows(train_MTK[:, :, k : k + 1], cfg), cfg)
        for k, name in enumerate(metrics)
    }
    return MinderModel(metrics=metrics, denoisers=denoisers)


def evaluate_dir(directory: Path, train: TrainConfig, detector: Any = None) -> dict[str, Any]:
    """Train on every server's train split, then the leave-one-server-out study."""
    from rankwatch.streams.minder.detector import MinderConfig
    from rankwatch.streams.minder.files import load_group
    from rankwatch.streams.minder.study import study

    group, names = load_group(directory)
    config = detector or MinderConfig(window=train.window, stride=max(train.window // 2, 1))
    models = {
        "minder": train_model(group.train_MTK, group.metrics, train),
        "joint": train_model(group.train_MTK, group.metrics, train, joint=True),
    }
    out = study(group, models, config)
    out["servers"] = names
    out["training"] = {"epochs": train.epochs, "window": train.window, "seed": train.seed}
    return out


def holdout_dir(
    directory: Path,
    held_out: list[str],
    train: TrainConfig,
    minutes_per_point: float,
    fa_budget: float | None = None,
    live: bool = False,
) -> dict[str, Any]:
    """Train on every server's train split, pick settings on the servers not in
    ``held_out`` and score the held-out ones (``rankwatch.streams.minder.holdout``)."""
    from rankwatch.streams.minder.detector import MinderConfig
    from rankwatch.streams.minder.files import GroupFileError, load_group
    from rankwatch.streams.minder.holdout import holdout_study

    group, names = load_group(directory)
    unknown = sorted(set(held_out) - set(names))
    if unknown or len(set(held_out)) >= len(names) or not held_out:
        raise GroupFileError(
            f"--holdout must name some but not all of {', '.join(names)}"
            + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    held = [names.index(n) for n in held_out]
    dev = [i for i in range(len(names)) if i not in held]
    config = MinderConfig(window=train.window, stride=max(train.window // 2, 1))
    model = train_model(group.train_MTK, group.metrics, train)
    ppd = 24 * 60 / minutes_per_point
    out = holdout_study(group, model, config, dev, held, ppd, fa_budget, live)
    for result in out.values():
        for seg in result.get("held_out_segments", []) if isinstance(result, dict) else []:
            seg["server"] = names[seg["server"]]
    out["development_servers"] = [names[i] for i in dev]
    out["held_out_servers"] = list(held_out)
    out["training"] = {"epochs": train.epochs, "window": train.window, "seed": train.seed}
    out["selection"] = _selection(fa_budget)
    return out


def rotation_dir(
    directory: Path,
    train: TrainConfig,
    minutes_per_point: float,
    fa_budget: float | None = None,
    live: bool = False,
) -> dict[str, Any]:
    """Train on every server's train split, hold out each server in turn and pool
    (``rankwatch.streams.minder.holdout.rotation_study``)."""
    from rankwatch.streams.minder.detector import MinderConfig
    from rankwatch.streams.minder.files import load_group
    from rankwatch.streams.minder.holdout import rotation_study

    group, names = load_group(directory)
    config = MinderConfig(window=train.window, stride=max(train.window // 2, 1))
    model = train_model(group.train_MTK, group.metrics, train)
    out = rotation_study(group, model, config, 24 * 60 / minutes_per_point, fa_budget, live)
    for result in out.values():
        for seg in result.get("held_out_segments", []):
            seg["server"] = names[seg["server"]]
    out["held_out_servers"] = names
    out["training"] = {"epochs": train.epochs, "window": train.window, "seed": train.seed}
    out["selection"] = _selection(fa_budget)
    return out


def _selection(fa_budget: float | None) -> dict[str, Any]:
    """How the settings were picked on the development servers (the output says so)."""
    if fa_budget is None:
        return {"by": "window_f1"}
    return {"by": "segments_within_false_alarm_budget", "false_alarms_per_machine_day": fa_budget}
