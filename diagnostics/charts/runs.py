"""The Runs page's table: human headers, numbers to 3 significant digits, float noise as 0, "–" for
an empty cell (the store's snake_case columns and 0.0000000000000008 are not for reading)."""

from __future__ import annotations

import math
from datetime import datetime

import pandas as pd
from pandas.io.formats.style import Styler

from diagnostics.metrics import FLOAT_NOISE

MISSING = "–"
SIGNIFICANT_DIGITS = 3
# Store column → header, in the table's order.
RUN_HEADERS = {
    "run_id": "run", "created": "created", "status": "status", "rule": "rule", "draft": "draft", "n_tokens": "tokens",
    "acceptance_rate": "acceptance rate", "block_efficiency": "block efficiency", "tokens_per_s": "tokens/s",
    "mean_tv_target": "mean TV(P, p)", "group_id": "group", "prompt": "prompt",
}
COUNT_COLUMNS = {"n_tokens"}
MEASURE_COLUMNS = {"acceptance_rate", "block_efficiency", "tokens_per_s", "mean_tv_target"}
# Up to this many cells the table is a pandas Styler (numbers stay numbers, so a click on a header
# sorts by value; about 0.5 s to render here); beyond it, plain text (Styler costs ~10 µs a cell,
# and Streamlit refuses one over pandas' 262,144-cell limit).
STYLED_CELLS_MAX = 60_000


def _missing(value: object) -> bool:
    return value is None or value is pd.NaT or (isinstance(value, float) and math.isnan(value))


def format_number(value: object) -> str:
    """A measure for reading: 3 significant digits (thousands grouped), float noise (``|x| <
    FLOAT_NOISE``) as 0, missing as "–"."""
    if _missing(value):
        return MISSING
    number = float(value)  # type: ignore[arg-type]
    if not math.isfinite(number):
        return str(number)
    if abs(number) < FLOAT_NOISE:
        return "0"
    if abs(number) >= 10 ** SIGNIFICANT_DIGITS:  # 1234.5 → "1,230", not "1.23e+03"
        digits = SIGNIFICANT_DIGITS - 1 - int(math.floor(math.log10(abs(number))))
        return f"{round(number, digits):,.0f}"
    return f"{number:.{SIGNIFICANT_DIGITS}g}"


def format_count(value: object) -> str:
    """A count with thousands grouped, missing as "–"."""
    return MISSING if _missing(value) else f"{int(value):,}"  # type: ignore[call-overload]


def format_text(value: object) -> str:
    """A text or time cell: a time to the second, missing as "–"."""
    if _missing(value):
        return MISSING
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def _formatter(column: str):
    if column in COUNT_COLUMNS:
        return format_count
    return format_number if column in MEASURE_COLUMNS else format_text


def runs_display(runs: pd.DataFrame) -> pd.DataFrame:
    """The store's runs (``Store.list_runs``) as the text the table shows, under human headers."""
    columns = [column for column in RUN_HEADERS if column in runs]
    shown = pd.DataFrame({RUN_HEADERS[column]: [_formatter(column)(value) for value in runs[column].tolist()]
                          for column in columns})
    return shown.reset_index(drop=True)


def runs_table(runs: pd.DataFrame) -> Styler | pd.DataFrame:
    """The table for ``st.dataframe``: the text of ``runs_display``, over the numbers while the
    table is small enough to style (sorting by a header then sorts numbers), else the text alone."""
    columns = [column for column in RUN_HEADERS if column in runs]
    if len(runs) * len(columns) > STYLED_CELLS_MAX:
        return runs_display(runs)
    data = runs[columns].reset_index(drop=True)
    # Text cells become their text here: Streamlit draws a null cell as "None" whatever the
    # Styler's display value says. Number cells stay numbers (so they sort by value) and an empty
    # one reads "–" through the formatter.
    numeric = COUNT_COLUMNS | MEASURE_COLUMNS
    data = pd.DataFrame({column: data[column] if column in numeric else [format_text(value) for value in data[column].tolist()]
                         for column in columns}).rename(columns=RUN_HEADERS)
    return data.style.format({RUN_HEADERS[column]: _formatter(column) for column in columns}, na_rep=MISSING)
