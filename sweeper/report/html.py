"""One self-contained HTML page for a sweep: the recommendation, the plots (embedded as base64 PNG)
and the table of points. Inline CSS, no scripts, nothing fetched from the network."""

from __future__ import annotations

import base64
import html
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

# A section of the page: a heading and either plain text (escaped, line breaks kept) or table rows.
Section = Tuple[str, Union[str, Sequence[Mapping[str, Any]]]]

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #222;
       max-width: 1100px; margin: 24px auto; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 6px; }
h2 { font-size: 17px; margin: 28px 0 8px; }
.meta { color: #555; font-size: 13px; margin: 0 0 16px; }
.meta span { margin-right: 18px; white-space: nowrap; }
.meta b { font-weight: 600; color: #333; }
.recommendation { background: #eef6ee; border: 1px solid #9cc79c; border-left: 6px solid #3a8a3a;
                  border-radius: 4px; padding: 12px 16px; white-space: pre-wrap; font-size: 15px; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; flex: 1 1 520px; max-width: 100%; }
figure img { width: 100%; height: auto; border: 1px solid #ddd; }
.note { white-space: pre-wrap; margin: 0 0 8px; }
figcaption { font-size: 12px; color: #666; }
table { border-collapse: collapse; font-size: 13px; display: block; max-width: 100%; overflow-x: auto; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: left; white-space: nowrap; }
th { background: #f4f4f4; }
th.num, td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:hover td { background: #fafafa; }
""".strip()

# A column whose cells are numbers (optionally with a "%" or a note such as " (unstable)"), or a
# placeholder for a missing one, is right-aligned so that its figures line up.
_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?%?( .*)?$")
_MISSING = ("", "-", "n/a")


def render(
    title: str,
    summary_rows: Sequence[Mapping[str, Any]],
    images: Mapping[str, Optional[str]],
    recommendation: str,
    meta: Mapping[str, str],
    sections: Sequence[Section] = (),
) -> str:
    """The page as a string.

    `summary_rows`: one dict per run; the columns are the keys in first-seen order, the values are
    shown as given (format numbers before), escaped. `images`: name -> PNG path, read and embedded
    (a None path is skipped; underscores in the name become spaces in the caption). `recommendation`:
    plain text, escaped, line breaks kept. `meta`: label -> value lines under the title. `sections`:
    (heading, text or rows) shown after the recommendation, before the plots (an empty one is left out)."""
    parts: List[str] = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_esc(title)}</title>",
        f"<style>\n{_CSS}\n</style>",
        "</head>",
        "<body>",
        f"<h1>{_esc(title)}</h1>",
    ]
    if meta:
        # Spaces between the items: the only places a long header may wrap (each item stays whole).
        items = " ".join(f"<span><b>{_esc(k)}:</b> {_esc(v)}</span>" for k, v in meta.items())
        parts.append(f'<p class="meta">{items}</p>')
    parts.append("<h2>Recommendation</h2>")
    parts.append(f'<div class="recommendation">{_esc(recommendation)}</div>')
    for heading, body in sections:
        if not body:
            continue
        parts.append(f"<h2>{_esc(heading)}</h2>")
        parts.append(f'<p class="note">{_esc(body)}</p>' if isinstance(body, str) else _table(body))

    figures = [_figure(name, path) for name, path in images.items() if path]
    if figures:
        parts.append("<h2>Plots</h2>")
        parts.append('<div class="plots">')
        parts.extend(figures)
        parts.append("</div>")

    parts.append(f"<h2>Points, one run per seed ({len(summary_rows)})</h2>")
    parts.append(_table(summary_rows))
    parts.extend(["</body>", "</html>", ""])
    return "\n".join(parts)


def _figure(name: str, path: str) -> str:
    with open(path, "rb") as f:
        data = base64.b64encode(f.read()).decode("ascii")
    caption = _esc(name.replace("_", " "))
    image = f'<img src="data:image/png;base64,{data}" alt="{caption}">'
    return f"<figure>{image}<figcaption>{caption}</figcaption></figure>"


def _table(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "<p>No points.</p>"
    columns: Dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    text = [{c: "" if row.get(c) is None else str(row.get(c)) for c in columns} for row in rows]
    numeric = {c for c in columns if _is_numeric([r[c] for r in text])}

    def cell(tag: str, column: str, content: str) -> str:
        kind = ' class="num"' if column in numeric else ""
        return f"<{tag}{kind}>{_esc(content)}</{tag}>"

    head = "".join(cell("th", c, c) for c in columns)
    body = ["<tr>" + "".join(cell("td", c, r[c]) for c in columns) + "</tr>" for r in text]
    return "<table>\n<thead><tr>" + head + "</tr></thead>\n<tbody>\n" + "\n".join(body) + "\n</tbody>\n</table>"


def _is_numeric(cells: List[str]) -> bool:
    shown = [c for c in cells if c not in _MISSING]
    return bool(shown) and all(_NUMBER.match(c) for c in shown)


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)
