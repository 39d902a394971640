"""Communication cost of one gradient all-reduce (APS §3.3.3, §4.2, Table 2).

Per worker and step, for a model with L layers (parameters) of n_l elements:

* payload: what the wire mode sends per value (:func:`wire_bytes`): ½
  byte for formats of at most 4 bits (two codes per byte, such as (3,
  0)), 1 byte for 5–8 bits (FP8, and FP6: a 6-bit code takes a byte),
  2 for FP16 / bfloat16, 4 for FP32 — not bits / 8;
* APS adds one all-reduce of one byte per low-precision layer (the
  exponents; Table 2: "allreduce(8 bits) + allreduce(8L bits)"), FP32
  with APS too (the wire sends them); layers kept in FP32 need none;
* a ring all-reduce over p workers takes 2(p − 1) steps and sends
  2(p − 1)/p of the message per worker; the hierarchical one with groups of
  k takes 4(k − 1) + 2(p/k − 1) steps (§4.2).

These are the byte counts a real implementation sends, and what the wire
mode (:mod:`~ada_loss.communication.wire`) sends (its tests count them at
the MPI calls; Kahan adds (p − 2)/p of the payload there). The emulated
mode of :mod:`~ada_loss.communication.communicator` gathers the format's
values stored as FP32, as CPD does.
"""
from ada_loss.communication.summation import hierarchical_steps, ring_steps
from ada_loss.formats import get_format


def format_bits(fmt):
    """Bits per value: 1 sign + exponent + mantissa bits."""
    f = get_format(fmt)
    return 1 + f.exp_bits + f.man_bits


def wire_bytes(fmt):
    """Bytes per value on the wire (``codes.WireCodec``'s packing): ½ for
    at most 4 bits, 1 for 5–8, 2 for 9–16, 4 for FP32 and wider."""
    f = get_format(fmt)
    bits = format_bits(f)
    if f.is_float32 or bits > 16:
        return 4.0
    return 0.5 if bits <= 4 else 1.0 if bits <= 8 else 2.0


def message_bytes(sizes, fmt, aps=True, fp32_mask=None):
    """``(exponent_bytes, payload_bytes)`` one worker contributes per step,
    as the wire mode sends them (tested against its counters).

    Args:
        sizes (list of int): elements per layer (parameter).
        fmt (str): the gradient format.
        aps (bool): one exponent byte per low-precision layer.
        fp32_mask (list of bool): layers kept in FP32 (4 bytes per value).
    """
    fp32_mask = fp32_mask or [False] * len(sizes)
    low = sum(n for n, keep in zip(sizes, fp32_mask) if not keep)
    high = sum(n for n, keep in zip(sizes, fp32_mask) if keep)
    payload = low * wire_bytes(fmt) + high * 4
    lp_layers = sum(1 for keep in fp32_mask if not keep)
    exps = lp_layers if aps else 0
    return exps, payload


def cost_rows(sizes, formats, workers, group_sizes=(), fp32_mask=None):
    """Rows of the cost table: one per (format, APS) and worker count.

    Returns:
        list of dict: format, aps, p, exponent bytes, payload bytes, total
        message bytes, bytes sent per worker by a ring (2(p−1)/p × message),
        ring steps, and ``steps_k<k>`` for each hierarchical group size.
    """
    rows = []
    for fmt in formats:
        f = get_format(fmt)
        for aps in ((False,) if f.is_float32 else (True, False)):
            exps, payload = message_bytes(sizes, fmt, aps, fp32_mask)
            for p in workers:
                row = {'format': f.name, 'bits': format_bits(fmt),
                       'aps': aps, 'p': p, 'exponent_bytes': exps,
                       'payload_bytes': payload,
                       'message_bytes': exps + payload,
                       'ring_sent_bytes': 2.0 * (p - 1) / p * (exps + payload),
                       'ring_steps': ring_steps(p)}
                for k in group_sizes:
                    if p % k == 0 and 1 < k < p:
                        row['steps_k{}'.format(k)] = hierarchical_steps(p, k)
                rows.append(row)
    return rows


def ring_bytes_saved(sizes, fmt, p, aps=True, fp32_mask=None):
    """Bytes one rank sends less per step than FP32 averaging, both as a
    ring all-reduce over ``p`` ranks (2(p − 1)/p of each message; the
    exponent message included)."""
    e32, b32 = message_bytes(sizes, 'float32', aps=False)
    e, b = message_bytes(sizes, fmt, aps, fp32_mask)
    return 2.0 * (p - 1) / p * ((e32 + b32) - (e + b))


def break_even_bandwidth(sizes, fmt, p, codec_seconds, fp32_seconds=0.0,
                         aps=True, fp32_mask=None):
    """The link bandwidth (bytes/s per link) below which the low-precision
    all-reduce is faster than FP32 averaging: the ring's byte saving
    (:func:`ring_bytes_saved`) divided by the extra local time of the codes
    (``codec_seconds`` per step, the encoding, the hops' ⊕ and decoding,
    less ``fp32_seconds``, FP32's own local additions). Both rings take
    the same 2(p − 1) steps, so latency cancels. ``inf`` when the codes
    cost no extra time."""
    extra = float(codec_seconds) - float(fp32_seconds)
    saved = ring_bytes_saved(sizes, fmt, p, aps, fp32_mask)
    return float('inf') if extra <= 0 else saved / extra
