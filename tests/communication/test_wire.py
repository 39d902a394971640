"""The wire mode of the APS all-reduce: format codes
(:mod:`ada_loss.communication.codes`) and the MPI ring/hierarchical sum
(:mod:`ada_loss.communication.wire`) — bit for bit the emulation, under real
``mpiexec`` with P = 2, 3, 4, 8 ranks, and the bytes each rank sends.
"""
import numpy
import pytest

from ada_loss.communication.codes import WireCodec, format_bits
from ada_loss.formats import get_format

from test_mpi_simulator import mpirun

NAMED = ['fp8_e4m3', 'fp8_e5m2', 'fp6_e3m2', 'fp6_e2m3', 'fp4_e2m1']
IEEE = ['e{}m{}'.format(e, m) for e in range(2, 8) for m in range(0, 8 - e)]
SMALL = NAMED + IEEE
ML_DTYPES = {'fp8_e4m3': 'float8_e4m3fn', 'fp8_e5m2': 'float8_e5m2',
             'e4m3': 'float8_e4m3', 'e3m4': 'float8_e3m4',
             'fp6_e3m2': 'float6_e3m2fn', 'fp6_e2m3': 'float6_e2m3fn',
             'fp4_e2m1': 'float4_e2m1fn'}


def sample(fmt, n=4000, seed=0):
    """Values of ``fmt`` over its whole range, ±0, ±Inf, NaN, quantized."""
    f = get_format(fmt)
    rng = numpy.random.RandomState(seed)
    x = (rng.standard_normal(n) *
         2.0 ** rng.randint(f.emin - f.man_bits - 2, f.emax + 2, n))
    x = numpy.concatenate([x, [0.0, -0.0, numpy.inf, -numpy.inf, numpy.nan,
                               f.u_min, -f.u_min, f.u_max, -f.u_max]])
    with numpy.errstate(over='ignore', invalid='ignore'):
        return f.quantize(x.astype(numpy.float32))


@pytest.mark.parametrize('fmt', SMALL + ['float16', 'bfloat16'])
def test_codes_round_trip_every_value(fmt):
    """decode(encode(x)) == x bit for bit for every code's value and for
    sampled quantized values (odd and even counts, so the last nibble is
    tested); a format without a NaN code says so and sends NaN as a number."""
    c = WireCodec(fmt)
    assert c.bits == format_bits(fmt) == 1 + get_format(fmt).exp_bits + \
        get_format(fmt).man_bits
    for x in (sample(fmt), sample(fmt)[:-1]):
        y = c.decode(c.encode(x), x.size)
        assert c.encode(x).size == c.nbytes(x.size)
        keep = ~numpy.isnan(x) if not c.has_nan else slice(None)
        assert numpy.array_equal(y[keep].view(numpy.uint32),
                                 x[keep].view(numpy.uint32))
        if not c.has_nan:     # NaN arrives as some number (not NaN)
            assert not numpy.isnan(y).any()
    if fmt not in ('float16',):
        table = c.decode_table
        with numpy.errstate(over='ignore', invalid='ignore'):
            # every code's value is a value of the format, and all differ
            assert numpy.array_equal(
                get_format(fmt).quantize(table).view(numpy.uint32),
                table.view(numpy.uint32))
        # non-NaN codes: distinct values, each encoded back to its code
        # (a NaN decodes to quantize's canonical NaN, whatever its payload)
        num = ~numpy.isnan(table)
        assert numpy.unique(table[num].view(numpy.uint32)).size == num.sum()
        codes = numpy.arange(table.size)
        back = c.encode(table)
        if c.kind == 'nibble':
            back = numpy.stack([back & 15, back >> 4], 1).ravel()
        else:
            back = back.view(numpy.uint16 if c.kind == 'half'
                             else numpy.uint8)
        assert numpy.array_equal(back[num], codes[num])


@pytest.mark.parametrize('fmt', sorted(ML_DTYPES))
def test_codes_are_ml_dtypes_bit_patterns(fmt):
    """The codes are the formats' standard bit patterns: those of ml_dtypes
    (OCP FP8/FP6/FP4, IEEE-style E4M3 and E3M4), the 4-bit ones packed two
    per byte, first value in the low nibble."""
    ml_dtypes = pytest.importorskip('ml_dtypes')
    x = sample(fmt)
    x = x[~numpy.isnan(x)]
    if get_format(fmt).overflow != 'inf':
        x = x[numpy.isfinite(x)]
    codes = x.astype(getattr(ml_dtypes, ML_DTYPES[fmt])).view(numpy.uint8)
    got = WireCodec(fmt).encode(x)
    if format_bits(fmt) <= 4:
        codes = numpy.append(codes, 0) if codes.size % 2 else codes
        codes = codes[0::2] | (codes[1::2] << 4)
    assert numpy.array_equal(got, codes)


def _patterns(lows=(0, 1, 0x7FFF, 0x8000, 0xFFFF), seed=0):
    """Every float32 top half (sign, exponent, 7 mantissa bits) with each
    low half of ``lows`` and a random non-zero one: 393216 values covering
    every sign, binade, NaN and Inf, both sides of every rounding tie."""
    top = numpy.arange(1 << 16, dtype=numpy.uint32) << numpy.uint32(16)
    rng = numpy.random.RandomState(seed)
    low = list(lows) + [int(rng.randint(2, 0x7FFF))]
    return [(top | numpy.uint32(lo)).view(numpy.float32) for lo in low]


@pytest.mark.parametrize('fmt', SMALL)
def test_round_encode_is_quantize_then_encode(fmt):
    """The fast path's rounding by table (top 16 bits rounded to odd: the
    low 16 only as zero / non-zero) gives the code of ``quantize`` (the
    project's own
    rounding: ties to even, subnormals, overflow to Inf / NaN / saturation,
    NaN) for every float32 top half with low halves on and off a tie,
    in one block and in blocks of 7 values."""
    from ada_loss.communication import codes as C
    c = WireCodec(fmt)
    f = get_format(fmt)
    for v in _patterns():
        with numpy.errstate(over='ignore', invalid='ignore'):
            q = f.quantize(v)
        want = c.encode_table[q.view(numpy.uint32) >> numpy.uint32(c.shift)]
        assert numpy.array_equal(c.round_encode(v), want)
    block = C.BLOCK
    try:
        C.BLOCK = 7
        assert numpy.array_equal(c.round_encode(v[:1000]), want[:1000])
    finally:
        C.BLOCK = block
    # packed as encode() packs (odd count: a zero high nibble at the end)
    for n in (999, 1000):
        assert numpy.array_equal(c.pack(c.round_encode(v[:n])),
                                 c.encode(q[:n]))


@pytest.mark.parametrize('fmt', SMALL)
def test_shifted_rounding(fmt):
    """APS's shift in the encoding pass (the product exact in float64,
    rounded once): the codes of ``quantize(scale_pow2(v, e))`` for every
    top half and tie lows, for shifts down past float32's normals and up
    past the range a table could fold (float32 subnormals that become
    format values), beyond float32's power-of-two range both ways."""
    from ada_loss.communication.allreduce import scale_layer
    c = WireCodec(fmt)
    f = get_format(fmt)
    for e in (-140, -127, -40, -3, -1, 1, 2, 17, 60, 125 + f.emin,
              127, 130, 140):
        for v in _patterns(lows=(0, 1, 0x8000)):
            with numpy.errstate(over='ignore', invalid='ignore'):
                q = f.quantize(scale_layer(v, e, numpy.empty_like(v)))
            want = c.encode_table[q.view(numpy.uint32) >>
                                  numpy.uint32(c.shift)]
            assert numpy.array_equal(c.round_encode(v, shift=e), want), e


@pytest.mark.parametrize('fmt', ['fp8_e5m2', 'e3m0', 'fp6_e2m3'])
def test_a_ranks_codes_of_shifted_layers(fmt):
    """The ring's own codes of a rank (``_CodePart.own_wire``) for layers
    with folded shifts, a shift too large to fold (a tiny layer with
    float32 subnormals: multiplied first) and unshifted gaps, in blocks of
    8 values and chunks starting at odd elements: the old route's bytes
    (``scale_pow2``, ``quantize``, ``encode``) for every chunk."""
    from ada_loss.communication import codes as C
    from ada_loss.communication.allreduce import scale_pow2
    from ada_loss.communication.wire import _CodePart
    c = WireCodec(fmt)
    f = get_format(fmt)
    big = 125 + f.emin - f.man_bits + 3
    rng = numpy.random.RandomState(3)
    sizes, shifts = [13, 7, 20, 11, 9], [5, 0, big, -3, 0]
    scales = [2.0 ** -8, 1.0, 2.0 ** (f.emax - big - 1), 2.0 ** 6, 0.25]
    x = numpy.concatenate([rng.standard_normal(n) * s
                           for n, s in zip(sizes, scales)]).astype(
        numpy.float32)
    # float32 subnormals in the tiny layer: non-zero once shifted
    x[30:34] = numpy.array([2.0 ** -127, -3 * 2.0 ** -129, 5 * 2.0 ** -131,
                            2.0 ** -126 - 2.0 ** -149], numpy.float32)
    segments, at = [], 0
    for n, e in zip(sizes, shifts):
        segments.append((at, at + n, e))
        at += n
    part = _CodePart(c, False, x.size, x, segments)
    shift = numpy.repeat(numpy.array(shifts, numpy.int32), sizes)
    with numpy.errstate(over='ignore', invalid='ignore'):
        want = f.quantize(scale_pow2(x, shift))
    assert numpy.count_nonzero(want[30:34]) >= 2
    block = C.BLOCK
    try:
        C.BLOCK = 8
        for a, b in ((0, x.size), (3, 40), (17, 18), (29, 60)):
            assert numpy.array_equal(part.own_wire(a, b),
                                     c.encode(want[a:b])), (a, b)
    finally:
        C.BLOCK = block


@pytest.mark.parametrize('fmt', sorted(ML_DTYPES))
def test_round_encode_agrees_with_ml_dtypes_casts(fmt):
    """An independent check of the rounding: ml_dtypes' compiled casts give
    the same bytes for every non-NaN pattern (overflow, saturation,
    subnormals and ties included; its NaN codes differ in payload, and
    FP6/FP4 have none)."""
    ml_dtypes = pytest.importorskip('ml_dtypes')
    c = WireCodec(fmt)
    for v in _patterns(lows=(0, 1, 0x8000)):
        keep = ~numpy.isnan(v)
        with numpy.errstate(over='ignore', invalid='ignore'):
            theirs = v[keep].astype(getattr(ml_dtypes, ML_DTYPES[fmt]))
        assert numpy.array_equal(c.round_encode(v[keep]),
                                 theirs.view(numpy.uint8))


@pytest.mark.parametrize('fmt', SMALL)
def test_code_tables_are_the_accumulators_operations(fmt):
    """Every pair of wire bytes (all 2^16; two nibble values per byte for
    ≤ 4 bits): ``add_codes``/``sub_codes`` decode to what the emulation's
    ⊕ gives on the decoded values (the Accumulator: FP32 operation, then
    ``quantize``), bit for bit, NaN where it gives NaN (a format without a
    NaN code: its NaN number, as ``encode``); the pair decoding of 1-byte
    codes equals the per-code table."""
    from ada_loss.communication.summation import Accumulator
    c = WireCodec(fmt)
    f = get_format(fmt)
    u = numpy.arange(1 << 16)
    a, b = (u >> 8).astype(numpy.uint8), (u & 255).astype(numpy.uint8)
    if c.kind == 'byte':
        # codes beyond 2^bits do not exist
        ok = (a < c.decode_table.size) & (b < c.decode_table.size)
        a, b = a[ok], b[ok]
    n = a.size * (2 if c.kind == 'nibble' else 1)
    x, y = c.decode(a, n), c.decode(b, n)
    for op, sign in ((c.add_codes, 1), (c.sub_codes, -1)):
        acc = Accumulator(x, f, False)
        acc.add(y * numpy.float32(sign))
        got = op(a, b)
        want = c.encode(acc.s)
        if c.has_nan:
            nan = numpy.isnan(acc.s)
            assert numpy.array_equal(numpy.isnan(c.decode(got, n)), nan)
            back = c.decode(got, n)
            assert numpy.array_equal(back[~nan].view(numpy.uint32),
                                     acc.s[~nan].view(numpy.uint32))
        else:
            assert numpy.array_equal(got, want)
    if c.kind == 'byte':
        for start in (0, 1):
            data = a[start:]
            assert numpy.array_equal(
                c.decode(data, data.size).view(numpy.uint32),
                c.decode_table[data].view(numpy.uint32))


def test_codes_reject_a_wrong_byte_count():
    with pytest.raises(ValueError, match='5 values of fp8_e5m2 take 5 bytes'):
        WireCodec('fp8_e5m2').decode(numpy.zeros(4, numpy.uint8), 5)


@pytest.fixture(scope='module', params=[2, 3, 4, 8])
def wire(request):
    return mpirun(request.param, [], worker='mpi_wire_worker.py')


def test_wire_equals_emulation_bit_for_bit(wire):
    """Every format with <= 8 bits (26) and FP16, bfloat16 (2-byte codes),
    with and without Kahan, ring and hierarchical orders (k = 1, 2, 3, 4,
    P), APS with a non-finite layer and an FP32 classifier, no APS with
    overflowing values and a NaN gradient, the hybrid FP32-first epoch; ragged layer sizes (n = 175, not a multiple of P):
    every rank's wire mean equals the emulation's (bit for bit; NaN at the
    same places)."""
    p = wire['ranks']
    orders = {2: 3, 3: 3, 4: 2, 8: 2}[p]
    kahans = 2 if p <= 4 else 1
    assert wire['checked'] == [orders * (2 * (len(SMALL) + 2) * kahans +
                                         2)] * p
    assert wire['failures'] == []
    # NaN cases are exercised, also in formats without a NaN code (FP6/FP4
    # with a NaN gradient, e<E>m0 with Inf − Inf)
    assert wire['with_nan'] > 0 and wire['nan_less_with_nan'] > 0


def test_wire_bytes(wire):
    """Bytes each rank sends, counted at the MPI calls: 2(P−1)/P per element
    for an 8-bit format, half that for a 4-bit one (0.25x and 0.125x FP32's
    ring); Kahan adds (P−2)/P of a code; FP32 layers 2(P−1)/P·4; plus one
    exponent byte per low-precision layer (APS), or one NaN flag byte
    (4-bit e3m0 has no NaN code) without APS."""
    p = wire['ranks']
    assert len(wire['bytes']) == 19
    for row in wire['bytes'][:16]:
        b = row['bits'] / 8.0
        lp = row['elements'] - row['fp32_elements']
        # reduce-scatter (Sendrecv) and all-gather (Allgatherv): each
        # (P − 1)/P of the codes
        half = (p - 1.0) / p * (lp * b + row['fp32_elements'] * 4)
        kahan = (p - 2.0) / p * lp * b if row['kahan'] else 0
        assert row['counts']['Sendrecv'] == half + kahan, row
        assert row['counts']['Allgatherv'] == half, row
        flag = 0 if row['fmt'] == 'fp8_e4m3' else 1
        assert row['counts'].get('Allreduce', 0) == (
            row['lp_layers'] if row['aps'] else flag), row


def test_cost_model_counts_what_the_wire_sends(wire):
    """``cost.message_bytes`` against the counters of every ring row
    (8-bit, 4-bit, 6-bit — one byte per code, not 6/8 —, FP32 with APS —
    one exponent byte per layer —, FP32 layers, with and without APS):
    the reduce-scatter sends (P − 1)/P of the payload (plus Kahan's
    compensation), the exponent all-reduce the exponent bytes (the NaN
    flag byte of a format without a NaN code is not in the model)."""
    from ada_loss.communication.cost import message_bytes
    p = wire['ranks']
    rows = wire['bytes'][:18]
    assert {r['fmt'] for r in rows} == {'fp8_e4m3', 'e3m0', 'fp6_e3m2',
                                        'float32'}
    for row in rows:
        lp, f32 = row['elements'] - row['fp32_elements'], row['fp32_elements']
        sizes = [lp, f32] if f32 else [lp // 2, lp // 2]
        mask = [False, True] if f32 else None
        exps, payload = message_bytes(sizes, row['fmt'], row['aps'], mask)
        assert exps == (row['lp_layers'] if row['aps'] else 0), row
        counts = row['counts']
        kahan = (p - 2.0) / p * (payload - f32 * 4) if row['kahan'] else 0
        assert counts['Sendrecv'] == (p - 1.0) / p * payload + kahan, row
        assert counts['Allgatherv'] == (p - 1.0) / p * payload, row
        if row['aps']:
            assert counts['Allreduce'] == exps, row


def test_wire_bytes_hierarchical(wire):
    """Hierarchical, 8-bit, groups of k (2, or P when P is odd): a member
    sends its n codes to its leader; a leader sends 2(G−1)/G·n in the ring
    among the G = P/k leaders and n in the broadcast to its group; every
    rank one exponent byte per layer."""
    p = wire['ranks']
    row = wire['bytes'][18]
    k, n = row['group_size'], row['elements']
    g = p // k
    assert len(row['counts_per_rank']) == p
    for rank, counts in enumerate(row['counts_per_rank']):
        expect = {'Allreduce': row['lp_layers']}
        if rank % k:
            expect['Send'] = n
        else:
            if g > 1:
                expect['Sendrecv'] = (g - 1) * n // g
                expect['Allgatherv'] = (g - 1) * n // g
            expect['Bcast'] = n
        assert counts == expect, (rank, counts)


@pytest.mark.parametrize('p', [2, 3, 4, 8])
def test_compiled_emulation_equals_numpy(p):
    """The simulator's and the emulated communicator's sum on codes with
    the compiled kernels (``mean_of_stacked``, ``reduce``) against the
    NumPy emulation (``reference=True``), bit for bit (NaN at the same
    places), on the MPI worker's cases: every format of at most 8 bits
    (and FP16, bfloat16: the NumPy route), Kahan on and off, ring and
    hierarchical orders, APS with an FP32 classifier and an Inf layer, no
    APS with overflow and a NaN gradient, the hybrid FP32-first epoch; in
    blocks of 16 values for every other case."""
    import mpi_wire_worker as W
    from ada_loss.communication import CommPolicy, StepReduction
    from ada_loss.communication import codes as C
    from ada_loss.communication import stacked
    block, seed, compiled = C.BLOCK, 0, 0
    try:
        for label, kw, epoch, large, nonfinite in W.cases(p):
            for order, k in W.orders(p):
                seed += 1
                C.BLOCK = 16 if seed % 2 else block
                plan = StepReduction(CommPolicy(order=order, group_size=k,
                                                **kw), W.NAMES, W.SIZES, p,
                                     epoch)
                bufs = W.buffers(p, seed, kw['fmt'], large)
                bufs[seed % p, 40 if nonfinite else 7] = \
                    numpy.inf if nonfinite else numpy.nan
                compiled += stacked.applies(plan)
                with numpy.errstate(over='ignore', invalid='ignore'):
                    want = plan.mean_of_stacked(bufs, reference=True)
                    got = plan.mean_of_stacked(bufs)
                    shift, bad = plan.shifts(plan.stacked_max_exps(bufs))
                    payload = plan.encode(bufs, shift)
                    got_reduce = plan.reduce(payload, shift, bad)
                assert W.same_nan(got, want), (label, order, k, kw)
                assert W.same_nan(got_reduce, want), (label, order, k, kw)
    finally:
        C.BLOCK = block
    assert compiled > seed // 2
