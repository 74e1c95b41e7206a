"""Published device measurements (devices/published.json) beside the planner's prediction: the check
that the planner agrees with what others measured on the devices (docs/devices.md).

Each row names a device profile, a model (a preset or one of the file's `models`), the weight
format's real bytes and the decode position; the prediction is the planner's plain decode at that
position with the format's exact weight and table bytes (PlanRequest.target_weight_bytes /
table_bytes), so only the device's figures are under test, not our own export's format.

>>> rows = compare()                                   # doctest: +SKIP
>>> rows[0]["predicted_tok_s"], rows[0]["tok_s"]        # doctest: +SKIP
(30.6, 30.6)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .dims import PRESETS_FILE, ModelDims, load_presets, recipe_drafter
from .errors import DeviceError
from .planner import PlanRequest, speed_plan
from .profiles import get_profile

PUBLISHED_FILE = Path(__file__).resolve().parent / "published.json"
BAND = 0.25  # predictions must fall within 25% of a published row unless it is an explained outlier
TABLE_BEGIN, TABLE_END = "<!-- published:begin -->", "<!-- published:end -->"


def load_published(path: str | Path = PUBLISHED_FILE) -> dict:
    """The published rows, weight formats and extra model dims."""
    return json.loads(Path(path).read_text())


def model_dims(name: str, data: dict) -> ModelDims:
    """A row's target dims: a planner preset, else one of the file's `models` (keys with a leading
    underscore are notes)."""
    if name in data["models"]:
        return ModelDims(**{k: v for k, v in data["models"][name].items() if k[0] != "_"})
    presets = load_presets(PRESETS_FILE)
    if name not in presets:
        raise DeviceError(f"published row model {name!r} is neither a preset nor in 'models'")
    return ModelDims(**presets[name]["target"])


def format_bytes(t: ModelDims, fmt: dict, file_bytes: int | None = None) -> tuple[float, tuple]:
    """(all weight bytes, (embedding, LM head) bytes) of `t` in a published weight format: `bits`
    per weight plus `scale_bytes` per `group`; the LM head (and the embedding, which a decode only
    gathers) at `head_bits`, one table when tied. A row's `file_bytes` replaces the total."""
    per_weight = fmt["bits"] / 8 + (fmt["scale_bytes"] / fmt["group"] if fmt["group"] else 0.0)
    table = t.embed_params * fmt["head_bits"] / 8
    tables = (0.0 if t.tie_word_embeddings else table, table)
    return float(file_bytes or t.layer_params() * per_weight + sum(tables)), tables


def row_request(row: dict, data: dict) -> PlanRequest:
    """The planner's request for one published row: plain decode at the row's position."""
    t = model_dims(row["model"], data)
    total, tables = format_bytes(t, data["formats"][row["format"]], row.get("file_bytes"))
    return PlanRequest(
        t,
        recipe_drafter(t),
        get_profile(row["device"]),
        row["precision"],
        context=row["position"],
        position=row["position"],
        target_weight_bytes=int(total),
        table_bytes=tables,
    )


def compare(data: dict | None = None) -> list[dict]:
    """Every published row with the planner's predicted tok/s and its error (predicted /
    published - 1)."""
    data = data or load_published()
    out = []
    for row in data["rows"]:
        predicted = speed_plan(row_request(row, data))["plain_tokens_per_s"]
        out.append(
            {**row, "predicted_tok_s": round(predicted, 1), "error": predicted / row["tok_s"] - 1}
        )
    return out


def markdown_table(rows: list[dict]) -> str:
    """The table docs/devices.md prints between its published markers."""
    lines = [
        "| # | Source | Date | Device | Model | Precision / format | Engine | Position | "
        "Published tok/s | Planned tok/s | Error | Role |",
        "|---|---|---|---|---|---|---|--:|--:|--:|--:|---|",
    ]
    for i, r in enumerate(rows, 1):
        role = "outlier (see below)" if r["outlier"] else ("fit" if r["fit"] else "check")
        lines.append(
            f"| {i} | [{r['source']}]({r['url']}) | {r['date']} | {r['device']} | {r['model']} | "
            f"{r['precision']} / {r['format']} | {r['engine']} | {r['position']} | {r['tok_s']:g} "
            f"| {r['predicted_tok_s']:g} | {100 * r['error']:+.0f}% | {role} |"
        )
    return "\n".join(lines)


def render_doc(text: str, rows: list[dict]) -> str:
    """`text` (docs/devices.md) with the table between its markers regenerated from `rows`."""
    head, rest = text.split(TABLE_BEGIN, 1)
    tail = rest.split(TABLE_END, 1)[1]
    return f"{head}{TABLE_BEGIN}\n{markdown_table(rows)}\n{TABLE_END}{tail}"


def main(argv: list[str]) -> None:
    """Regenerate the table of the doc at argv[0] (docs/devices.md) from devices/published.json."""
    path = Path(argv[0])
    path.write_text(render_doc(path.read_text(), compare()))


if __name__ == "__main__":
    main(sys.argv[1:])
