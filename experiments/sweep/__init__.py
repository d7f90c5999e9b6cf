"""Running a sweep: the CLI (`python -m experiments.sweep`), configs, isolated point processes, launchers, runs.csv.
Top of the pipeline: it may import measure, train and report; nothing in experiments imports it.
Keep this file free of imports, so that importing a submodule loads only what that submodule needs.
"""
