"""The Outbrain Click Prediction (Kaggle) input tables: columns, file names, time base, input checks.

Shared by both engines (preproc.outbrain.pipeline, preproc.outbrain.nvt read them) and
the synthetic generator (preproc.outbrain.generate writes them); pure Python.
"""
from __future__ import annotations

import os

from preproc.dataio import textio
from preproc.errors import PreprocError

OUTBRAIN_EPOCH_MS = 1465876799998
DAY_MS = 86_400_000

# table -> [(column, spark type, required)]; the header line is the column names joined by ','.
TABLES = {
    "clicks_train": [("display_id", "bigint", True), ("ad_id", "bigint", True), ("clicked", "int", True)],
    "events": [("display_id", "bigint", True), ("uuid", "string", True), ("document_id", "bigint", True),
               ("timestamp", "bigint", True), ("platform", "string", False), ("geo_location", "string", False)],
    "promoted_content": [("ad_id", "bigint", True), ("document_id", "bigint", True),
                         ("campaign_id", "bigint", False), ("advertiser_id", "bigint", False)],
    "documents_meta": [("document_id", "bigint", True), ("source_id", "bigint", False),
                       ("publisher_id", "bigint", False), ("publish_time", "string", False)],
    "documents_categories": [("document_id", "bigint", True), ("category_id", "bigint", True),
                             ("confidence_level", "double", True)],
    "documents_topics": [("document_id", "bigint", True), ("topic_id", "bigint", True),
                         ("confidence_level", "double", True)],
    "documents_entities": [("document_id", "bigint", True), ("entity_id", "string", True),
                           ("confidence_level", "double", True)],
    "page_views": [("uuid", "string", True), ("document_id", "bigint", True), ("timestamp", "bigint", True),
                   ("platform", "string", False), ("geo_location", "string", False),
                   ("traffic_source", "string", False)],
}
TABLE_FILE_ALIASES = {"page_views": ["page_views", "page_views_sample"]}


def header_of(table: str) -> str:
    return ",".join(name for name, _, _ in TABLES[table])


def locate_tables(input_dir: str) -> dict[str, str]:
    """{table: csv path} of the eight tables; one-line error for a missing, empty or mis-headed one."""
    from preproc.dataio.output import input_files

    if not os.path.isdir(input_dir):
        raise PreprocError(f"--input: {input_dir}: not a directory holding the Outbrain CSV tables")
    paths = {}
    for table in TABLES:
        candidates = [os.path.join(input_dir, f"{name}{ext}") for name in TABLE_FILE_ALIASES.get(table, [table])
                      for ext in (".csv", ".csv.gz")]
        found = [p for p in candidates if os.path.isfile(p)]
        if not found:
            raise PreprocError(f"--input: {os.path.join(input_dir, table + '.csv')}: missing Outbrain table {table}")
        path = str(input_files(found[0])[0])
        first = textio.first_line(path)
        if first != header_of(table):
            raise PreprocError(f"--input: {path}: header is {(first or '')[:60]!r}, expected {header_of(table)!r}")
        if textio.line_count_at_most(path, 2) < 2:
            raise PreprocError(f"--input: {path}: table {table} has a header but no rows")
        paths[table] = path
    return paths


def check_split_sizes(expected: dict, input_dir: str) -> None:
    if 0 in expected.values():
        raise PreprocError(f"--input: {input_dir}: the {'train' if not expected['train'] else 'test'} split is "
                           "empty (check --split-days / --train-fraction)")
