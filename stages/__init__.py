"""Compiler stages: one module per row of ``stages:`` in pipeline.yaml (STYLE 2).

Every stage module has the same shape, so the task layer can drive any of
them by name:

- ``NAME`` and ``ARTIFACT`` (the file name of its output in the kernel's out dir);
- ``Options``: a frozen dataclass whose fields are the stage's ``options:``;
- ``run(ir_in, options, machine) -> ir_out``: pure, no files;
- ``serialize(ir) -> bytes`` and ``read(path) -> ir`` (ArtifactError on a bad file);
- ``verify(ir, machine)``: raises VerifyError naming the stage;
- ``DUMPS``: dump kind -> ``writer(ir, path, machine)``.
"""
