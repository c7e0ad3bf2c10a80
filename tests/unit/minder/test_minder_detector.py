"""The detector end to end on generated machines: a drifting machine is found, a glitch
and a healthy group are not, and the forward pass in numpy equals torch's."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from rankwatch.streams.minder import MinderConfig, MinderModel, detect
from rankwatch.streams.minder.detector import decide, metric_scores
from rankwatch.streams.minder.serial import model_from_arrays, model_to_arrays
from rankwatch.streams.minder.vae import VaeWeights, denoise_series, reconstruct

CONFIG = MinderConfig(window=16, stride=16, continuity=3, threshold=3.0)


def machines(m: int = 12, t: int = 320, k: int = 3, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = 0.5 + 0.3 * np.sin(np.arange(t) / 9.0)[None, :, None]
    return np.clip(base + 0.02 * rng.standard_normal((m, t, k)), 0, 1)


def random_weights(inputs: int = 1, hidden: int = 4, latent: int = 8, seed: int = 0) -> VaeWeights:
    rng = np.random.default_rng(seed)
    shapes = {
        "enc_w_ih": (4 * hidden, inputs),
        "enc_w_hh": (4 * hidden, hidden),
        "enc_b": (4 * hidden,),
        "mu_w": (latent, hidden),
        "mu_b": (latent,),
        "dec_w_ih": (4 * hidden, latent),
        "dec_w_hh": (4 * hidden, hidden),
        "dec_b": (4 * hidden,),
        "out_w": (inputs, hidden),
        "out_b": (inputs,),
    }
    return VaeWeights(8, {n: rng.normal(0, 0.5, s).astype(np.float32) for n, s in shapes.items()})


def test_a_drifting_machine_is_reported_by_its_metric() -> None:
    x = machines()
    x[5, 160:, 1] -= 0.3
    model = MinderModel(metrics=("cpu", "gpu", "net"), priority=("gpu", "cpu", "net"))
    det = detect(x, model, CONFIG)
    reported = np.nonzero(det.confirmed_NM)
    assert set(reported[1].tolist()) == {5}
    first = int(reported[0].min())
    assert det.starts[first] == 160 + 2 * 16  # the third candidate window
    assert model.metrics[det.metric_N[first]] == "gpu"


def test_no_report_on_a_healthy_group_or_a_glitch() -> None:
    model = MinderModel(metrics=("cpu", "gpu", "net"))
    assert not detect(machines(), model, CONFIG).confirmed_NM.any()
    x = machines()
    x[3, 100:120, 0] += 0.4  # one or two windows: a glitch
    assert not detect(x, model, CONFIG).confirmed_NM.any()
    assert detect(x, model, replace(CONFIG, continuity=1)).confirmed_NM[:, 3].any()


def test_priority_stops_at_the_first_metric_that_detects() -> None:
    x = machines()
    x[2, :, 0] += 0.3
    x[4, :, 2] += 0.3
    model = MinderModel(metrics=("a", "b", "c"), priority=("c", "a", "b"))
    det = detect(x, model, CONFIG)
    assert set(np.nonzero(det.confirmed_NM)[1].tolist()) == {4}
    quick = detect(x, model, replace(CONFIG, continuity=1))
    assert np.isnan(quick.scores_KNM[:2]).all()  # "c" decided every window: a, b not computed
    conf, _ = decide(metric_scores(x, model, CONFIG), model, CONFIG)
    assert (conf == det.confirmed_NM).all()
    everything = detect(x, model, replace(CONFIG, use_priority=False))
    assert set(np.nonzero(everything.confirmed_NM)[1].tolist()) == {2, 4}


def test_denoised_detection_and_model_round_trip() -> None:
    w = random_weights()
    model = MinderModel(metrics=("a",), denoisers={"a": w}, thresholds={"a": 2.5})
    back = model_from_arrays(model_to_arrays(model))
    assert back.thresholds == {"a": 2.5} and back.metrics == ("a",)
    assert np.array_equal(back.denoisers["a"].arrays["dec_w_hh"], w.arrays["dec_w_hh"])
    x = machines(k=1)
    rec = denoise_series(w, x[:, :, 0][:, :317])
    assert rec.shape == (12, 317) and np.isfinite(rec).all()
    detect(x, back, CONFIG)


def test_numpy_forward_equals_torch() -> None:
    torch = pytest.importorskip("torch")
    from rankwatch.streams.minder.train import LstmVae

    torch.manual_seed(0)
    net = LstmVae(3, 4, 8)
    x = np.random.default_rng(0).random((40, 8, 3)).astype(np.float32)
    with torch.no_grad():
        y, _, _ = net(torch.from_numpy(x), sample=False)
    assert np.abs(y.numpy() - reconstruct(net.export(8), x)).max() < 1e-5
    for block in (1, 7, 40):  # blocks of any size, a last one partial: the same result
        assert np.abs(y.numpy() - reconstruct(net.export(8), x, block)).max() < 1e-5


def test_threads_do_not_change_the_result() -> None:
    x = machines()
    x[5, 160:, 1] -= 0.3
    w = random_weights()
    model = MinderModel(metrics=("a", "b", "c"), denoisers={"a": w, "b": w, "c": w})
    one = detect(x, model, CONFIG)
    two = detect(x, model, replace(CONFIG, workers=2))
    assert np.array_equal(one.confirmed_NM, two.confirmed_NM)
    assert np.array_equal(one.metric_N, two.metric_N)
    assert np.allclose(one.scores_KNM, two.scores_KNM, equal_nan=True)


def test_reference_peers_estimate_the_mean_distance_of_a_large_group() -> None:
    from rankwatch.streams.minder import similarity

    rng = np.random.default_rng(0)
    w = 0.5 + 0.05 * rng.standard_normal((3000, 60))
    w[1234] += 0.3
    ref = similarity.reference_peers(3000)
    assert ref is not None and ref.size == similarity.REFERENCE_PEERS
    exact, estimate = similarity.mean_distances(w), similarity.mean_distances_to(w, ref)
    assert np.abs(estimate - exact).max() < 0.05 * (exact.max() - exact.min())
    s = similarity.window_scores(w, np.array([0]), 60, 0.02)[0]
    assert int(np.argmax(s)) == 1234 and np.sort(s)[-2] < 5
