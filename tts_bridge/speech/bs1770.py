"""ITU-R BS.1770 integrated loudness and true peak of mono audio, in numpy alone.

The meter measures as pyloudnorm 0.2 does (its K-weighting: the same two biquads from the same
formulas at any sample rate; 400 ms blocks every 100 ms, the absolute and relative gates), so a
sentence's loudness is what it was before, without scipy's filters and without a Python loop
per sample.

An IIR filter cannot be vectorised naively: each output depends on the previous ones. The two
biquads in cascade are one linear system of 4 states, run on blocks of `_BLOCK` samples: within
a block, the output from a zero state is a product with the Toeplitz matrix of the impulse
response; the state a block hands to the next is a linear recurrence over blocks, solved by
doubling (log2 of the number of blocks small matrix products), and its effect on the next
block's output is one more matrix product. The result equals the sample-by-sample filter to
rounding.

The true peak is the largest magnitude of the signal 4x oversampled with the interpolation
filter of BS.1770 annex 2. An interpolated value is a weighted sum of 12 samples, so it can pass
a level only near a sample larger than that level divided by the filter's gain bound; only those
places are interpolated.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

_BLOCK = 64
"""Samples per block of the filter: the Toeplitz product grows with it, the recurrence over
blocks shrinks."""
_NEGLIGIBLE = 1e-18
"""A state carried over this fraction of its size changes no sample (double precision)."""
_TAIL_FRACTION = 1e-13
_MAX_TAIL_BLOCKS = 10_000
_GATE_S = 0.4
_STEP = 0.25
"""Gating blocks start every quarter block (75 % overlap)."""
_ABSOLUTE_GATE = -70.0
_RELATIVE_GATE = -10.0

# BS.1770 annex 2: phases 1 to 3 of the 48-tap interpolator (phase 0 is the sample itself, to
# within the filter's ripple; the sample is used instead). Phase p at index i + 6 is the value a
# quarter p of a sample period after sample i.
_INTERPOLATOR = np.array(
    [
        [
            -0.0291748046875, 0.0292968750000, -0.0517578125000, 0.0891113281250,
            -0.1665039062500, 0.4650878906250, 0.7797851562500, -0.2003173828125,
            0.1015625000000, -0.0582275390625, 0.0330810546875, -0.0189208984375,
        ],
        [
            -0.0189208984375, 0.0330810546875, -0.0582275390625, 0.1015625000000,
            -0.2003173828125, 0.7797851562500, 0.4650878906250, -0.1665039062500,
            0.0891113281250, -0.0517578125000, 0.0292968750000, -0.0291748046875,
        ],
        [
            -0.0083007812500, 0.0148925781250, -0.0266113281250, 0.0476074218750,
            -0.1022949218750, 0.9721679687500, 0.1373291015625, -0.0594482421875,
            0.0332031250000, -0.0196533203125, 0.0109863281250, 0.0017089843750,
        ],
    ]
)  # fmt: skip
_TAPS = _INTERPOLATOR.shape[1]
_BEFORE = 5
"""Samples before sample i that the values between i and i + 1 read (and _TAPS - 1 - _BEFORE
after it)."""
_GAIN_BOUND = float(np.abs(_INTERPOLATOR).sum(axis=1).max())
"""No interpolated value is larger than this times the largest sample it reads."""
_WINDOW = (_TAPS - 1 - _BEFORE) - np.arange(_TAPS)
"""Offsets, from sample i, of the samples phase taps 0..11 multiply (newest first)."""


def _biquad(kind: str, gain_db: float, q: float, fc: float, rate: int) -> tuple[FloatArray, ...]:
    """pyloudnorm's (RBJ cookbook) coefficients, normalized by a0."""
    a = 10 ** (gain_db / 40.0)
    w0 = 2.0 * math.pi * fc / rate
    alpha = math.sin(w0) / (2.0 * q)
    cos = math.cos(w0)
    if kind == "high_shelf":
        root = 2 * math.sqrt(a) * alpha
        b = [
            a * ((a + 1) + (a - 1) * cos + root),
            -2 * a * ((a - 1) + (a + 1) * cos),
            a * ((a + 1) + (a - 1) * cos - root),
        ]
        den = [(a + 1) - (a - 1) * cos + root, 2 * ((a - 1) - (a + 1) * cos)]
        den.append((a + 1) - (a - 1) * cos - root)
    else:  # high pass
        b = [(1 + cos) / 2, -(1 + cos), (1 + cos) / 2]
        den = [1 + alpha, -2 * cos, 1 - alpha]
    return np.array(b) / den[0], np.array(den) / den[0]


def _state_space(b: FloatArray, a: FloatArray) -> tuple[FloatArray, ...]:
    """A biquad in transposed direct form II (as lfilter runs it): s' = A s + B x, y = C s + D x."""
    step = np.array([[-a[1], 1.0], [-a[2], 0.0]])
    return step, b[1:] - a[1:] * b[0], np.array([1.0, 0.0]), np.array(b[0])


@functools.lru_cache(maxsize=16)
def _plan(rate: int) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """The K-weighting filter of `rate` as block matrices: the Toeplitz matrix, L x L; the
    state from the input, L x 4; the output from the state, 4 x L; the state over a block, 4 x 4.
    """
    a1, b1, c1, d1 = _state_space(*_biquad("high_shelf", 4.0, 1 / math.sqrt(2), 1500.0, rate))
    a2, b2, c2, d2 = _state_space(*_biquad("high_pass", 0.0, 0.5, 38.0, rate))
    # The two in cascade, each with its own state (better conditioned than one 4th-order
    # polynomial, whose poles crowd near 1 at high rates): the second is fed the first's output.
    step = np.block([[a1, np.zeros((2, 2))], [np.outer(b2, c1), a2]])
    into = np.concatenate([b1, b2 * d1])
    out = np.concatenate([d2 * c1, c2])
    direct = float(d2 * d1)
    powers = [np.eye(4)]
    for _ in range(_BLOCK):
        powers.append(step @ powers[-1])
    impulse = np.array([direct, *(out @ powers[k] @ into for k in range(_BLOCK - 1))])
    toeplitz = np.zeros((_BLOCK, _BLOCK))
    for j in range(_BLOCK):
        toeplitz[j, j:] = impulse[: _BLOCK - j]
    from_input = np.stack([powers[_BLOCK - 1 - j] @ into for j in range(_BLOCK)])
    to_output = np.stack([out @ powers[i] for i in range(_BLOCK)]).T
    return toeplitz, from_input, to_output, powers[_BLOCK]


def k_weighted(samples: FloatArray, rate: int) -> FloatArray:
    """`samples` through the K-weighting filter (from a zero state)."""
    toeplitz, from_input, to_output, over_block = _plan(rate)
    count = samples.size
    blocks = -(-count // _BLOCK)
    if count == blocks * _BLOCK:
        x = np.ascontiguousarray(samples).reshape(blocks, _BLOCK)
    else:
        padded = np.zeros(blocks * _BLOCK)
        padded[:count] = samples
        x = padded.reshape(blocks, _BLOCK)
    # Each block's output from a zero state, and the state it ends in. Two products rather
    # than one with the matrices side by side: the halves of one result would be strided
    # views, and the products below run several times slower on strided operands.
    y = x @ toeplitz
    states = x @ from_input
    # The state at each block's end: s_k = M s_k-1 + v_k, as a prefix sum by doubling, until
    # M to the power of the shift is too small to change a sample.
    power, shift = over_block, 1
    while shift < blocks and np.abs(power).max() > _NEGLIGIBLE:
        states[shift:] += states[:-shift] @ power.T
        power = power @ power
        shift *= 2
    y[1:] += states[:-1] @ to_output
    return y.reshape(-1)[:count]


@functools.lru_cache(maxsize=16)
def _tail(rate: int) -> int:
    """Samples after which what the filter carries from an input is below 1e-13 of it."""
    over_block = _plan(rate)[3]
    blocks, power = 1, over_block
    while np.abs(power).max() > _TAIL_FRACTION and blocks < _MAX_TAIL_BLOCKS:
        power = power @ over_block
        blocks += 1
    return blocks * _BLOCK


def spans(
    points: npt.NDArray[np.intp], before: int, after: int, count: int
) -> npt.NDArray[np.intp]:
    """The sorted indices below `count` within `before` before or `after` after any of the
    sorted `points` (in time proportional to the points and the result, not to `count`)."""
    starts = np.maximum(points - before, 0)
    ends = np.minimum(points + after + 1, count)
    fresh = np.ones(points.size, dtype=bool)
    fresh[1:] = starts[1:] > np.maximum.accumulate(ends)[:-1]
    first = np.flatnonzero(fresh)
    run_starts = starts[first]
    lengths = np.maximum.reduceat(ends, first) - run_starts
    shifts = run_starts - np.concatenate(([0], np.cumsum(lengths)[:-1]))
    return np.asarray(np.arange(int(lengths.sum())) + np.repeat(shifts, lengths), dtype=np.intp)


def k_weighted_where(
    values: FloatArray, where: npt.NDArray[np.intp], count: int, rate: int
) -> tuple[npt.NDArray[np.intp], FloatArray]:
    """The K-weighting of `count` samples that are 0 but `values` at the sorted indices
    `where`: the indices where it is not negligible (from each of `where` on, for the filter's
    tail) and the output there. Those stretches are filtered end to end as one signal: what
    one carries into the next has decayed below 1e-13 of it."""
    active = spans(where, 0, _tail(rate), count)
    signal = np.zeros(active.size)
    signal[np.searchsorted(active, where)] = values
    return active, k_weighted(signal, rate)


def block_energies(samples: FloatArray, rate: int) -> FloatArray:
    """The mean square of each gating block of the K-weighted signal (as pyloudnorm scales it);
    the audio must be at least one gating block long."""
    weighted = k_weighted(samples, rate)
    bounds = segment_bounds(weighted.size, rate)
    return energies_of(segment_energies(weighted, bounds), rate)


def segment_bounds(count: int, rate: int) -> npt.NDArray[np.int64]:
    """Where the quarter blocks of the gating blocks of `count` samples start, and the last
    one ends (cut at `count`): block j is quarters j to j + 3."""
    blocks = round((count / rate - _GATE_S) / (_GATE_S * _STEP)) + 1
    j = np.arange(blocks + 4, dtype=np.float64)
    # As pyloudnorm computes a block's bounds, operation for operation (truncated to ints):
    # j * 0.25 + 1 and (j + 4) * 0.25 are the same double, so block j ends where j + 4 starts.
    return np.minimum((_GATE_S * (j * _STEP) * rate).astype(np.int64), count)


def segment_energies(weighted: FloatArray, bounds: npt.NDArray[np.int64]) -> FloatArray:
    """The sum of squares of K-weighted audio in each quarter block."""
    total = np.concatenate(([0.0], np.cumsum(weighted * weighted)))
    return np.asarray(total[bounds[1:]] - total[bounds[:-1]], dtype=np.float64)


def energies_of(segments: FloatArray, rate: int) -> FloatArray:
    """The gating blocks' mean squares (as pyloudnorm scales them) from the quarter blocks'."""
    blocks = segments[:-3] + segments[1:-2] + segments[2:-1] + segments[3:]
    return np.asarray(np.maximum(blocks, 0.0) / (_GATE_S * rate), dtype=np.float64)


def changed_segments(  # noqa: PLR0917  (the measure before, and the change)
    segments: FloatArray,
    bounds: npt.NDArray[np.int64],
    weighted: FloatArray,
    scale: float,
    where: npt.NDArray[np.intp],
    change: FloatArray,
) -> FloatArray:
    """segment_energies of `scale` x `weighted` minus `change` at the indices `where`, from
    `segments` (those of `weighted`): sum (s y - d)^2 = s^2 sum y^2 - 2 s sum y d + sum d^2."""
    quarter = np.searchsorted(bounds, where, side="right") - 1
    inside = quarter < segments.size
    quarter, where, change = quarter[inside], where[inside], change[inside]
    cross = np.bincount(quarter, weights=weighted[where] * change, minlength=segments.size)
    own = np.bincount(quarter, weights=change * change, minlength=segments.size)
    return np.asarray(scale * scale * segments - 2 * scale * cross + own, dtype=np.float64)


def gated_loudness(energies: FloatArray) -> float:
    """Integrated loudness (LUFS) from block energies: the absolute gate, then the relative one
    (-inf when no block passes)."""
    with np.errstate(divide="ignore"):
        levels = -0.691 + 10.0 * np.log10(energies)
    loud = energies[levels >= _ABSOLUTE_GATE]
    if loud.size == 0:
        return -math.inf
    relative = -0.691 + 10.0 * math.log10(float(loud.mean())) + _RELATIVE_GATE
    kept = energies[(levels > relative) & (levels > _ABSOLUTE_GATE)]
    if kept.size == 0:
        return -math.inf
    mean = float(kept.mean())
    return -0.691 + 10.0 * math.log10(mean) if mean > 0 else -math.inf


def integrated_loudness(samples: FloatArray, rate: int) -> float:
    """BS.1770 integrated loudness in LUFS of audio at least one gating block long."""
    return gated_loudness(block_energies(samples, rate))


def true_peaks(samples: FloatArray, floor: float) -> FloatArray:
    """Per sample, the largest magnitude of the 4x oversampled signal from it to the next one.

    Exact wherever that can exceed `floor`; elsewhere the sample's own magnitude (at most
    `floor` too), which is all a limiter with its ceiling at `floor` or above needs."""
    magnitude = np.abs(samples)
    big = np.flatnonzero(magnitude > floor / _GAIN_BOUND)
    if big.size == 0:
        return magnitude
    # The values after sample i read samples i - _BEFORE .. i + _TAPS - 1 - _BEFORE: a big
    # sample j is read by those after samples j - (_TAPS - 1 - _BEFORE) .. j + _BEFORE.
    near = spans(big, _TAPS - 1 - _BEFORE, _BEFORE, samples.size)
    reads = near[:, None] + _WINDOW[None, :]
    windows = samples[np.clip(reads, 0, samples.size - 1)]
    windows[(reads < 0) | (reads >= samples.size)] = 0.0  # zeros before and after the audio
    between = np.abs(windows @ _INTERPOLATOR.T).max(axis=1)
    magnitude[near] = np.maximum(magnitude[near], between)
    return magnitude
