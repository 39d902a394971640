"""What a recorded run's mode meant when it ran, where a default changed
since (issue 47).

``adaptive``'s ``init_scale`` default was 1 (α_{N+1} = 1, the paper's
constant) until issue 47's pre-registered test made it ``'format'``
(:func:`ada_loss.adaptive.ada_loss_scaled.format_rule`: the amax rule where
the loss gradient's format cannot hold 1/B as a normal number, else 1). A
run recorded as plain ``adaptive`` before that change ran with α_{N+1} = 1;
where its format holds 1/B as a normal number that is what ``format``
does too (bit-identical), elsewhere (E4M3 at B = 128) it is not today's
``adaptive``. Runs recorded since carry ``mode_resolved`` (every option's
value, :func:`ada_loss.scaling.resolved_mode`), so only older records need
this check. A table that pools such a run says so in a footnote.
"""
from ada_loss.adaptive.ada_loss_scaled import format_rule
from ada_loss.scaling import make_loss_scaling, parse_mode

#: the footnote's words for a run that ran before the change
CONSTANT_ALPHA = ('ran with α_{N+1} = 1, the default before issue 47 made '
                  "`init_scale=format` adaptive's default; today's "
                  '`adaptive` is `init_scale=format`')


def ran_with_constant_alpha(info, mode, precision, rows):
    """Whether a pooled run ran ``adaptive`` at the old default α_{N+1} = 1
    where today's default would not: its record (``info``, a ``run.json``
    dict or a results.json entry) has no ``mode_resolved``, its mode is
    ``adaptive`` with no ``init_scale`` given (the recorded
    ``mode_options``; a record without them: the table's ``mode`` text),
    and the loss gradient's format in ``precision`` cannot hold 1/``rows``
    as a normal number (``rows``: the loss gradient's rows, the batch size
    of a classifier, batch × block of a language model)."""
    if 'mode_resolved' in info:
        return False
    if 'mode_options' in info:
        name, options = info.get('mode_name'), info['mode_options'] or {}
    else:
        spec = parse_mode(mode)
        name, options = spec.name, spec.options
    if name != 'adaptive' or 'init_scale' in options or not rows:
        return False
    fmt = make_loss_scaling(info.get('mode') or mode, precision).fmt
    return format_rule(fmt, int(rows)) is not None


def constant_alpha_note(flagged):
    """The footnote for ``flagged``, descriptions of the pooled runs
    :func:`ran_with_constant_alpha` found (empty: no footnote)."""
    if not flagged:
        return ''
    return '{} pooled `adaptive` run{} {}: {}.'.format(
        len(flagged), '' if len(flagged) == 1 else 's', CONSTANT_ALPHA,
        '; '.join(flagged[:8]) + ('; …' if len(flagged) > 8 else ''))
