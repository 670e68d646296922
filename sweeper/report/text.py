"""The report in words: the answer the console prints and the parent run's tag holds, the full reasoning
(the report's "Why"), and the rows of the page's table of points, fastest first."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from sweeper.report import headline, reasons
from sweeper.report.analysis import Recommendation, Trial
from sweeper.report.critical_batch import CriticalBatch
from sweeper.units import MiB, format_bytes


def table_rows(trials: List[Trial]) -> List[Dict[str, str]]:
    """The page's table of points, the fastest first (tokens/s for a language model)."""
    return [table_row(t) for t in sorted(trials, key=_speed, reverse=True)]


def _speed(t: Trial) -> float:
    return t.tokens_per_second or t.samples_per_second or -1.0


def table_row(t: Trial) -> Dict[str, str]:
    """One run of the report's table of points; a language model's lead with tokens/s and the judged loss."""
    def fmt(value: Optional[float], pattern: str) -> str:
        return "-" if value is None else pattern.format(value)

    row = {
        "point": t.key,
        "micro": str(t.micro_batch_size),
        "accum": str(t.accumulation_steps),
        "workers": str(t.num_workers),
        "global": str(t.global_batch_size),
        "status": t.status + (f" ({t.diverged_reason})" if t.status == "diverged" and t.diverged_reason else ""),
        "samples/s": fmt(t.samples_per_second, "{:.1f}") + ("" if t.throughput_stable is not False else " (unstable)")
        + (" (emulated)" if t.throughput_emulated else ""),
        "cv": fmt(t.samples_per_second_cv, "{:.1%}"),
        "comm MiB/step": fmt(None if t.communication_bytes_per_step is None
                             else t.communication_bytes_per_step / MiB, "{:.1f}"),
        "peak MiB": fmt(None if t.peak_memory_bytes is None else t.peak_memory_bytes / MiB, "{:.0f}"),
        "val acc": fmt(t.val_accuracy, "{:.3f}"),
        "lr": fmt(t.lr, "{:.4g}"),
        "B_simple": fmt(t.gns_b_simple, "{:.1f}"),
    }
    if t.tokens_per_second is None:
        return row
    # A language model: throughput in tokens, quality as the judged loss (bits per byte, else nats per token).
    lead = {"point": t.key, "tokens/s": fmt(t.tokens_per_second, "{:.0f}") + (" (emulated)" if t.throughput_emulated
                                                                              else "")}
    if t.val_bits_per_byte is not None:
        lead["bits/byte"] = fmt(t.val_bits_per_byte, "{:.3f}")
    elif t.val_loss is not None:
        lead["val loss"] = fmt(t.val_loss, "{:.3f}")
    if t.activation_bytes_per_token is not None:
        row["act. KiB/token"] = fmt(t.activation_bytes_per_token / 1024, "{:.1f}")
    return {**lead, **{k: v for k, v in row.items() if k not in lead}}


def answer_text(rec: Recommendation, line: Optional[str], found: Optional[CriticalBatch] = None,
                context: Optional[int] = None, glance: Optional[Tuple[List[str], Optional[str]]] = None,
                chosen_word: str = "recommended", run: Optional[headline.RunWords] = None) -> str:
    """What the console prints and the parent run's tag holds: the headline (at most 3 lines of 120
    characters; a branch sweep's `glance` says whether to train the schedule or the constant layout; `run`, the
    run's figures: headline.headline), the table of alternatives, and the critical batch size in one line."""
    text = "\n".join(headline.headline(rec, line, glance, run))
    rows = headline.alternatives(rec, chosen_word)
    if rows:
        text += "\n" + headline.table_text(rows)
    if found is not None:
        text += f"\nCritical batch: {found.in_words(context)}."
    return text


def recommendation_text(rec: Recommendation, line: Optional[str], found: Optional[CriticalBatch] = None,
                        context: Optional[int] = None) -> str:
    """The full reasoning: the report's "Why"."""
    if rec.best is None:
        text = f"No recommendation: {rec.reason}"
    else:
        best = rec.best
        tokens = "" if best.context is None else f" sequences, {best.global_batch_size * best.context} tokens"
        text = f"Train with {rec.best.key} (global batch {rec.best.global_batch_size}{tokens}). {rec.reason}"
        if line:
            text += f"\nOverrides: {line}"
        if rec.runners_up:
            text += "\nRunners-up: " + "; ".join(_figures_text(t, rec.quality) for t in rec.runners_up)
    if found is not None:
        text += f"\nCritical batch: {found.in_words(context)}."
    return text


def _figures_text(t: Trial, quality: str = "val_accuracy") -> str:
    figures = [reasons.rate_text(t) if t.samples_per_second is not None else "no throughput"]
    if t.peak_memory_bytes is not None:
        figures.append(format_bytes(t.peak_memory_bytes, 0, unit="MiB"))
    value = getattr(t, quality, None) if quality in ("val_accuracy", "val_loss", "val_bits_per_byte") \
        else (t.metric(quality) or (None,))[0]
    if value is not None:
        figures.append(f"{quality} {value:.3f}")
    return f"{t.key} ({', '.join(figures)})"
