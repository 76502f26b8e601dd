"""The Outbrain Click Prediction (Kaggle) input tables: columns, file names, time base.

Shared by the pipeline (preproc.outbrain reads them) and the synthetic
generator (preproc.generate_outbrain writes them); pure Python.
"""
from __future__ import annotations

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
