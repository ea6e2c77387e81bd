"""One instance's chain as data: its spec, its record of stage keys, its manifest, its failures."""
