"""Every notebook runs from a fresh checkout at tiny size (BAYES_KERAS_NOTEBOOK_SMALL=1), and is saved with
its full-size outputs so it reads on a repository page."""

import os

import nbformat
import pytest
from nbclient import NotebookClient
from paths import ROOT

NOTEBOOKS = os.path.join(ROOT, "notebooks")
NAMES = sorted(f for f in os.listdir(NOTEBOOKS) if f.endswith(".ipynb"))


def test_there_is_a_quickstart_and_one_notebook_per_method():
    assert NAMES == [
        "00_quickstart.ipynb",
        "01_gaussian_particle_flow.ipynb",
        "02_matrix_svgd.ipynb",
        "03_mgvbp.ipynb",
        "04_local_refinement.ipynb",
        "05_particle_flow_bayes_rule.ipynb",
    ]


@pytest.mark.parametrize("name", NAMES)
def test_saved_with_outputs(name):
    notebook = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(cell.execution_count for cell in code), (
        f"{name}: not every cell was executed"
    )
    outputs = [o for cell in code for o in cell.outputs]
    assert outputs, f"{name}: saved without outputs"
    assert not [o for o in outputs if o.get("output_type") == "error"], (
        f"{name}: saved with an error"
    )


@pytest.mark.subprocess
@pytest.mark.parametrize("name", NAMES)
def test_runs_at_tiny_size(name, monkeypatch):
    monkeypatch.setenv("BAYES_KERAS_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    notebook = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": NOTEBOOKS}}
    ).execute()
