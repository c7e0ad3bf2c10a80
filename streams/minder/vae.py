"""The LSTM-VAE denoiser's forward pass in numpy, from exported weights.

One small model per metric (the paper: window 8, hidden 4, latent 8, one layer)
reconstructs each window of that metric; Minder measures distances between the
reconstructions, which keeps the shape of a machine's series and drops its jitter.
Training happens offline with torch (``rankwatch.streams.minder.train``); the stream
worker only needs these arrays, so it runs without torch.

Architecture (the trainer builds exactly this): an encoder LSTM reads the window one
value at a time; its last hidden state gives the latent mean (the variance head is
used only in training); a decoder LSTM reads the latent mean at every step and a
linear layer maps its hidden state to the reconstructed value. Gate order is
PyTorch's (input, forget, cell, output).

Legend: B windows, L window length, H hidden size, Z latent size, I input size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rankwatch.streams.minder.similarity import may_have_gaps

F32 = NDArray[np.float32]
Arr = NDArray[Any]
WEIGHT_NAMES = (
    "enc_w_ih",  # (4H, I)
    "enc_w_hh",  # (4H, H)
    "enc_b",  # (4H,) = bias_ih + bias_hh
    "mu_w",  # (Z, H)
    "mu_b",  # (Z,)
    "dec_w_ih",  # (4H, Z)
    "dec_w_hh",  # (4H, H)
    "dec_b",  # (4H,)
    "out_w",  # (I, H)
    "out_b",  # (I,)
)


@dataclass(frozen=True)
class VaeWeights:
    """The inference weights of one LSTM-VAE; ``window`` is the length it was trained on."""

    window: int
    arrays: Mapping[str, F32]

    @property
    def inputs(self) -> int:
        return int(self.arrays["enc_w_ih"].shape[1])

    def to_arrays(self, prefix: str = "") -> dict[str, NDArray[np.float32 | np.int64]]:
        out: dict[str, NDArray[np.float32 | np.int64]] = {
            prefix + k: np.asarray(v) for k, v in self.arrays.items()
        }
        out[prefix + "window"] = np.array(self.window, dtype=np.int64)
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, NDArray], prefix: str = "") -> VaeWeights:
        missing = [n for n in WEIGHT_NAMES if prefix + n not in arrays]
        if missing:
            raise ValueError(f"VAE weights lack {', '.join(prefix + m for m in missing)}")
        return cls(
            window=int(arrays[prefix + "window"]),
            arrays={n: np.asarray(arrays[prefix + n], dtype=np.float32) for n in WEIGHT_NAMES},
        )


def _gate_rows(w: F32, hidden: int) -> F32:
    """PyTorch's gate rows (i, f, g, o) reordered to (i, f, o, g), the sigmoid gates
    halved so that one tanh serves all four: sigmoid(x) = (tanh(x / 2) + 1) / 2."""
    h = hidden
    out = np.concatenate([w[: 2 * h], w[3 * h :], w[2 * h : 3 * h]]).astype(np.float32)
    out[: 3 * h] *= 0.5
    return out


def _lstm_step(gates_GB: Arr, h_HB: Arr, c_HB: Arr, hidden: int) -> None:
    """The rest of one LSTM step once ``gates_GB`` holds the pre-activations, in place,
    feature-major (gates x batch, each gate a contiguous block): no array is allocated
    (at a few hundred KiB each, fresh arrays cost page faults every step)."""
    np.tanh(gates_GB, out=gates_GB)
    sig = gates_GB[: 3 * hidden]
    sig *= 0.5
    sig += 0.5
    i, f, o, g = (gates_GB[k * hidden : (k + 1) * hidden] for k in range(4))
    c_HB *= f
    i *= g
    c_HB += i
    np.tanh(c_HB, out=h_HB)
    h_HB *= o


BLOCK = 8192
"""Windows reconstructed at a time: a block's arrays (gates 16 x 8192 float32, 512 KiB)
stay in the CPU's L2 cache through all the LSTM steps; one pass over a million windows
would stream every step's arrays through memory instead (three times slower), and
smaller blocks pay numpy's per-call overhead more often (measured on this box, per
metric of 10,000 machines x 900 s: 0.20 s at 2,048, 0.19 s at 4,096, 0.18 s at 8,192,
0.19 s at 16,384; ``benchmarks/README.md``)."""
THREADED_BLOCK = 32_768
"""The block when several threads denoise at once: each numpy call holds the GIL for
its overhead, and with 2,048-wide arrays two threads spend their time waiting for it
(measured: no faster than one); 32,768-wide blocks are a little slower alone but two
threads run them twice as fast."""


def reconstruct(weights: VaeWeights, x_BLI: F32, block: int = BLOCK) -> F32:
    """Reconstruct a batch of windows (B, L, I) -> (B, L, I) with the latent mean."""
    prepared = _prepare(weights)
    x = np.asarray(x_BLI, dtype=np.float32)
    out = np.empty(x.shape, dtype=np.float32)
    for start in range(0, x.shape[0], block):
        # one strided copy from the block's feature-major result straight into place
        out[start : start + block] = _reconstruct_block(
            prepared, x[start : start + block]
        ).transpose(2, 0, 1)
    return out


def _prepare(weights: VaeWeights) -> dict[str, Arr]:
    """The weights in the layout the steps use: gate rows reordered, and each LSTM's
        input and bias columns appended to its recurrent matrix, so that one matrix product
        per step gives the pre-activations from the stacked state [h; input; 1]; the
    decoder's split in two, as its input does not change between steps (``_decode``)."""
    a = weights.arrays
    hidden = a["enc_w_hh"].shape[1]
    enc = np.concatenate(
        [a["enc_w_hh"], a["enc_w_ih"], a["enc_b"][:, None]], axis=1, dtype=np.float32
    )
    dec = np.concatenate(
        [a["dec_w_hh"], a["dec_w_ih"], a["dec_b"][:, None]], axis=1, dtype=np.float32
    )
    dec = _gate_rows(dec, hidden)
    return {
        "enc": _gate_rows(enc, hidden),
        "dec_hh": np.ascontiguousarray(dec[:, :hidden]),
        "dec_in": np.ascontiguousarray(dec[:, hidden:]),
        "mu_w": a["mu_w"],
        "mu_b": a["mu_b"][:, None],
        "out_w": a["out_w"],
        "out_b": a["out_b"][None, :, None],
    }


def _reconstruct_block(p: dict[str, Arr], x_BLI: F32) -> F32:
    """Windows (B, L, I) -> reconstructions, feature-major (L, I, B)."""
    gate_rows, width = p["enc"].shape
    hidden = gate_rows // 4
    b, length, inputs = x_BLI.shape
    x_LIB = np.ascontiguousarray(x_BLI.transpose(1, 2, 0))
    gates = np.empty((gate_rows, b), dtype=np.float32)
    z = np.zeros((width, b), dtype=np.float32)  # [h; x_t; 1]
    z[-1] = 1.0
    h, c = z[:hidden], np.zeros((hidden, b), dtype=np.float32)
    for t in range(length):
        z[hidden : hidden + inputs] = x_LIB[t]
        np.matmul(p["enc"], z, out=gates)
        _lstm_step(gates, h, c, hidden)
    out_LIB = np.empty((length, p["out_w"].shape[0], b), dtype=np.float32)
    _decode(p, h, gates, out_LIB)
    out_LIB += p["out_b"]
    return out_LIB


def _decode(p: dict[str, Arr], h_enc_HB: Arr, gates_GB: Arr, out_LIB: Arr) -> None:
    """The decoder LSTM from the encoder's last hidden state. Its input, the latent
    mean, is the same at every step, so its share of the pre-activations (and the
    bias) is computed once; each step then multiplies only the 4 hidden rows, not the
    13 rows of [h; mu; 1]."""
    hidden = h_enc_HB.shape[0]
    latent = p["mu_w"].shape[0]
    b = h_enc_HB.shape[1]
    mu1 = np.empty((latent + 1, b), dtype=np.float32)  # [mu; 1]
    np.matmul(p["mu_w"], h_enc_HB, out=mu1[:latent])
    mu1[:latent] += p["mu_b"]
    mu1[-1] = 1.0
    steady = p["dec_in"] @ mu1
    h, c = np.zeros((hidden, b), dtype=np.float32), np.zeros((hidden, b), dtype=np.float32)
    for t in range(out_LIB.shape[0]):
        if t == 0:
            gates_GB[...] = steady  # h = 0: nothing recurrent yet
        else:
            np.matmul(p["dec_hh"], h, out=gates_GB)
            gates_GB += steady
        _lstm_step(gates_GB, h, c, hidden)
        np.matmul(p["out_w"], h, out=out_LIB[t])


def _reconstruct_chunks(weights: VaeWeights, chunks_BLI: F32, block: int = BLOCK) -> F32:
    """Reconstruct chunks; a chunk with a missing point (NaN) comes back all NaN: a
    reconstruction from invented values would be compared as if it were measured."""
    if not may_have_gaps(chunks_BLI):
        return reconstruct(weights, chunks_BLI, block)
    gap_B = np.isnan(chunks_BLI).any(axis=(1, 2))
    rec = reconstruct(weights, np.nan_to_num(chunks_BLI, nan=0.0), block)
    rec[gap_B] = np.nan
    return rec


def denoise_series(weights: VaeWeights, x_MT: NDArray[np.floating], block: int = BLOCK) -> F32:
    """Reconstruct whole series (M, T) of one metric chunk by chunk (chunks of the model's
    window; a last partial chunk is padded with its final value and cut back)."""
    m, t = x_MT.shape
    w = weights.window
    n = -(-t // w)
    padded = np.empty((m, n * w), dtype=np.float32)
    padded[:, :t] = x_MT
    if n * w > t:
        padded[:, t:] = x_MT[:, -1:]
    rec = _reconstruct_chunks(weights, padded.reshape(m * n, w, 1), block)
    return rec.reshape(m, n * w)[:, :t]


def denoise_joint(weights: VaeWeights, x_MTK: NDArray[np.floating], block: int = BLOCK) -> F32:
    """The ablation "one joint model": all K metrics through one VAE with K inputs."""
    m, t, k = x_MTK.shape
    w = weights.window
    n = -(-t // w)
    padded = np.empty((m, n * w, k), dtype=np.float32)
    padded[:, :t] = x_MTK
    if n * w > t:
        padded[:, t:] = x_MTK[:, -1:]
    rec = _reconstruct_chunks(weights, padded.reshape(m * n, w, k), block)
    return rec.reshape(m, n * w, k)[:, :t]
