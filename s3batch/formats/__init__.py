"""Reading records: the formats s3batch reads, and how a file's format is told from its key.

Parsers: :class:`s3batch.formats.csv.CsvParser`, :class:`s3batch.formats.jsonl.JsonlParser` (each
yields :class:`s3batch.formats.common.Record` s and knows where the next record starts), built for a
format by :func:`s3batch.formats.parsers.make_parser`; the format and compression of a key:
:mod:`s3batch.formats.keys`; opening a file on S3 at a checkpoint (gzip, the CSV header on resume):
:mod:`s3batch.formats.source`. This package module imports none of them: importing one reader does
not import the others (pyarrow, zstandard).
"""
