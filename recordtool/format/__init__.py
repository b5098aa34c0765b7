"""The on-disk format: OFRecord framing, the index file and the manifest (spec: FORMAT.md)."""
