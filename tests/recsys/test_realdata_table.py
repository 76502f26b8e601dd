"""Issue 37 item 8, pure: docs/data.md's "Results on real data" table is what its one command
(``python tests/realdata_figures.py``) prints for the figures it shows, and the prose's gaps to the
strongest baselines are the table's differences. The figures themselves come from the slow runs
(tests/recsys/test_realdata_*.py hold the engines to them); this keeps the docs from drifting off the
command and the prose off the table."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
import realdata_figures  # noqa: E402

NUM = r"(\d+\.\d+)"
RUN = r"\(epoch (\d+), (\d+) evaluations, (\d+) s\)"


def docs_section():
    text = (REPO / "docs" / "data.md").read_text()
    return text[text.index("## Results on real data"):].split("\n## ")[0]


def docs_table(section):
    lines = section.splitlines()
    start = lines.index(realdata_figures.HEADER)
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return lines[start:end]


def figures(rows):
    """(runs, baselines) as realdata_figures.main passes them to table(), read back from the docs' rows."""
    cells = [[c.strip() for c in row.strip("|").split(" | ")] for row in rows[2:]]
    hr, ndcg, *ncf = re.fullmatch(rf"{NUM} / {NUM} {RUN}", cells[0][3]).groups()
    runs = {"ncf": {"best": {"metrics": {"hr_at_10": float(hr), "ndcg_at_10": float(ndcg)}, "epoch": int(ncf[0])},
                    "evaluations": int(ncf[1]), "seconds": float(ncf[2])}}
    for key, row in zip(("wd", "dlrm", "wd_num"), cells[1:]):
        auc, epoch, evaluations, seconds = re.fullmatch(rf"{NUM} {RUN}", row[3]).groups()
        runs[key] = {"best": {"metrics": {"auc": float(auc)}, "epoch": int(epoch)},
                     "evaluations": int(evaluations), "seconds": float(seconds)}

    def tabular(cell):
        found = dict(re.fullmatch(rf"(\w+) {NUM}", part).groups() for part in cell.split("; "))
        return float(found["LogisticRegression"]), float(found["HistGradientBoosting"])

    ml = {m[0]: (float(m[1]), float(m[2])) for m in
          (re.fullmatch(rf"([\w ]+) {NUM} / {NUM}", part).groups() for part in cells[0][4].split("; "))}
    return runs, {"adult": tabular(cells[1][4]), "num": tabular(cells[3][4]), "ml": ml}


def test_the_docs_table_is_what_the_command_prints():
    section = docs_section()
    rows = docs_table(section)
    assert "python tests/realdata_figures.py" in section
    runs, base = figures(rows)
    assert realdata_figures.table(runs, base) == rows
    # the strongest standard baselines are there: HistGradientBoosting, `implicit`'s ALS and BPR
    assert set(base["ml"]) == {"implicit ALS", "implicit BPR", "popularity"}
    for row in rows[2:]:
        assert (REPO / row.rsplit(" | ", 1)[1].split(" ")[0].strip("| ")).is_file(), row


def test_the_prose_gaps_are_the_tables():
    """The gaps the prose states, to the rounding of the table's figures (4 decimals for AUC, 3 for
    HR/NDCG) and of the prose's own (3 decimals)."""
    section = docs_section()
    runs, base = figures(docs_table(section))
    auc = {k: runs[k]["best"]["metrics"]["auc"] for k in ("wd", "dlrm", "wd_num")}
    prose = " ".join(section.split())
    stated = re.search(rf"beats both models, by {NUM} AUC \(Wide & Deep\) and {NUM} \(DLRM\), and on the numerical "
                       rf"columns alone by {NUM}", prose).groups()
    gaps = [base["adult"][1] - auc["wd"], base["adult"][1] - auc["dlrm"], base["num"][1] - auc["wd_num"]]
    assert all(abs(float(s) - g) <= 0.0006 for s, g in zip(stated, gaps)), (stated, gaps)
    als, ncf = base["ml"]["implicit ALS"], runs["ncf"]["best"]["metrics"]
    stated = re.search(rf"`implicit`'s ALS beats NCF by {NUM} HR@10 and {NUM} NDCG@10", prose).groups()
    gaps = [als[0] - ncf["hr_at_10"], als[1] - ncf["ndcg_at_10"]]
    assert all(abs(float(s) - g) <= 0.0015 for s, g in zip(stated, gaps)), (stated, gaps)
