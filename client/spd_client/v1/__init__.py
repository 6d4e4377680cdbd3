"""Generated stubs of the SPD public API, version 1 (spd.v1); regenerate with `python -m spd_client.gen_protos`."""
