"""The bridge's own BS.1770 meter, true peak and limiter against the references they replaced:
pyloudnorm (and scipy's filters), a development dependency only."""

from __future__ import annotations

import numpy as np
import pyloudnorm
import pytest
from scipy.ndimage import minimum_filter1d, uniform_filter1d

from tts_bridge.bench.loudness import raw_sentences
from tts_bridge.config import Settings, load_settings
from tts_bridge.speech import bs1770
from tts_bridge.speech.loudness import LoudnessNormalizer, limit_peaks, true_peak_dbfs

RATES = (8000, 16000, 22050, 24000, 44100, 48000)
CEILING = 10 ** (-1 / 20)


def _signals(rate: int) -> list[np.ndarray]:
    rng = np.random.default_rng(rate)
    t = np.arange(int(2.3 * rate)) / rate
    burst = np.where((t % 0.7) < 0.2, 1.0, 0.001)  # loud and near-silent blocks: both gates
    return [
        0.1 * np.sin(2 * np.pi * 997 * t),
        rng.normal(0, 0.05, t.size),
        0.3 * np.sin(2 * np.pi * 60 * t) * burst,
        rng.normal(0, 0.2, int(0.41 * rate)),  # barely one gating block
        # Blocks at every level from -50 dB up, a fraction of a dB apart: where each gate falls
        # decides which count.
        rng.normal(0, 0.3, 8 * rate) * 10 ** np.linspace(-2.5, 0, 8 * rate),
        rng.normal(0, 0.01, 8 * rate) * 10 ** np.linspace(-2.5, 0, 8 * rate),  # and near -70
    ]


@pytest.mark.parametrize("rate", RATES)
def test_the_meter_measures_what_pyloudnorm_does(rate: int) -> None:
    meter = pyloudnorm.Meter(rate)
    for signal in _signals(rate):
        assert bs1770.integrated_loudness(signal, rate) == pytest.approx(
            meter.integrated_loudness(signal), abs=1e-6
        )
    silent = np.zeros(rate)
    assert bs1770.integrated_loudness(silent, rate) == -np.inf


def test_the_filter_is_the_sample_by_sample_one() -> None:
    rate = 22050
    signal = np.random.default_rng(3).normal(0, 0.1, 5000)
    (b1, a1), (b2, a2) = ((f.b, f.a) for f in pyloudnorm.Meter(rate)._filters.values())
    expected = np.zeros_like(signal)
    for b, a in ((b1, a1), (b2, a2)):  # the difference equations, one sample at a time
        x, y = (expected if b is b2 else signal), np.zeros_like(signal)
        for n in range(signal.size):
            y[n] = sum(b[k] * x[n - k] for k in range(3) if n >= k) - sum(
                a[k] * y[n - k] for k in (1, 2) if n >= k
            )
        expected = y
    np.testing.assert_allclose(bs1770.k_weighted(signal, rate), expected, atol=1e-12)


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    tmp = tmp_path_factory.mktemp("meter")
    return load_settings(
        None, {"cache": {"dir": str(tmp / "cache")}, "synthesis": {"onnx_threads": 1}}, environ={}
    )


def test_the_voices_sentences_measure_as_with_pyloudnorm(settings: Settings) -> None:
    """The bench's announcements as joe and heart make them, raw and at other gains."""
    normalizer = LoudnessNormalizer(None, 0.0)
    sentences = raw_sentences(settings)
    assert len(sentences) >= 20
    for voice, rate, pcm in sentences:
        samples = pcm.astype(np.float64) / 32768
        if samples.size < 0.41 * rate:  # the bridge repeats a short word up to a block
            samples = np.resize(samples, int(np.ceil(0.4 * rate)) + 1)
        for scale in (1.0, 0.2, 3.0):
            reference = pyloudnorm.Meter(rate).integrated_loudness(samples * scale)
            assert normalizer.measure(samples * scale, rate) == pytest.approx(
                reference, abs=1e-6
            ), voice


def _interpolated_everywhere(samples: np.ndarray) -> np.ndarray:
    peaks = np.abs(samples)
    for phase in bs1770._INTERPOLATOR:
        values = np.convolve(samples, phase)[6 : 6 + samples.size]
        peaks = np.maximum(peaks, np.abs(values))
    return np.asarray(peaks, dtype=np.float64)


def test_true_peaks_are_exact_wherever_they_may_pass_the_floor() -> None:
    rng = np.random.default_rng(7)
    t = np.arange(20000) / 48000
    # A quarter of the sample rate at 45 degrees: every sample at 0.707 of the crest.
    isp = 0.9 * np.sin(np.pi / 2 * np.arange(t.size) + np.pi / 4)
    for samples in (rng.normal(0, 0.25, 20000), isp, 0.5 * np.sin(2 * np.pi * 440 * t)):
        full = _interpolated_everywhere(samples)
        for floor in (0.2, 0.5, 0.8):
            peaks = bs1770.true_peaks(samples, floor)
            over = full > floor
            np.testing.assert_allclose(peaks[over], full[over], rtol=1e-12)
            assert np.all(peaks[~over] <= floor)
    assert true_peak_dbfs(isp, 48000) == pytest.approx(20 * np.log10(0.9), abs=0.1)
    assert 20 * np.log10(np.abs(isp).max()) < true_peak_dbfs(isp, 48000) - 2.5


def _reference_limiter(samples: np.ndarray, rate: int) -> np.ndarray:
    """The limiter as it was written with scipy's filters."""
    peaks = _interpolated_everywhere(samples)
    needed = np.minimum(1.0, CEILING / np.maximum(peaks, 1e-9))
    width = 2 * max(1, round(0.005 * rate)) + 1
    smooth = uniform_filter1d(minimum_filter1d(needed, width, mode="nearest"), width)
    return np.asarray(samples * np.minimum(smooth, needed), dtype=np.float64)


@pytest.mark.parametrize("rate", [16000, 22050, 48000])
def test_the_limiter_is_the_one_written_with_scipy(rate: int) -> None:
    rng = np.random.default_rng(rate)
    speechlike = rng.normal(0, 0.25, 3 * rate) * np.where(rng.random(3 * rate) < 0.01, 4, 1)
    clicks = 0.05 * np.sin(2 * np.pi * 440 * np.arange(rate) / rate)
    clicks[[10, rate // 2, rate - 3]] = 0.99  # at both ends too
    for samples in (speechlike, clicks, np.full(300, 0.95)):
        np.testing.assert_allclose(
            limit_peaks(samples, rate, CEILING), _reference_limiter(samples, rate), atol=1e-9
        )
        # Under the ceiling, but for what turning a peak down moves between the samples.
        limited = limit_peaks(samples, rate, CEILING)
        assert true_peak_dbfs(limited, rate) <= -1.0 + 0.1
    quiet = 0.3 * clicks
    assert limit_peaks(quiet, rate, CEILING) is quiet  # nothing over: not even copied
