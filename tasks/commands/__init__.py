"""What `kiln compile/run/test/bench/tune` do over the DAG, below the CLI's parsing."""
