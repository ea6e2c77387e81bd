"""Where chains run: in this process, a process pool (`-n N`) or a Dask cluster."""
