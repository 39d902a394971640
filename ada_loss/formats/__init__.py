"""Numerical formats: the range of each format and FP16 GEMM emulation."""
from ada_loss.formats.float_format import FloatFormat, get_format  # NOQA
from ada_loss.formats.fp16_gemm import (  # NOQA
    FP16_GEMM_MODES, emulates_fp16_gemm, fp16_gemm_mode, round_to)
