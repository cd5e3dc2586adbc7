"""Where a trial's MLflow artifacts go: the study's output folder for a database store (MLflow's own
default is ./mlruns under the working folder of whichever process creates the experiment), the
server's own place for a tracking server."""

from __future__ import annotations

import pytest

from ablate.drive import driver as driver_module
from ablate.drive.stores import Stores
from ablate.study.load import load_study


class _Seen(Exception):
    pass


@pytest.mark.parametrize(
    "uri, inside",
    [("postgresql://u:p@127.0.0.1:1/db", True), ("sqlite:///x.db", True), ("http://127.0.0.1:5000", False)],
)
def test_artifacts_stay_in_the_output_folder_unless_a_server_keeps_them(
    write_study, tmp_path, monkeypatch, uri, inside
):
    study = load_study(write_study())
    stores = Stores.for_study(study, output=tmp_path / "out", tracking_uri=uri)
    seen = {}

    def fake_tracker(tracking_uri, experiment, artifact_root=None, create=True):
        seen["root"] = artifact_root
        raise _Seen

    monkeypatch.setattr(driver_module, "Tracker", fake_tracker)
    monkeypatch.setattr(Stores, "storage", lambda self: None)  # no database is reached
    with pytest.raises(_Seen):
        driver_module.Driver(study, stores)
    assert seen["root"] == ((tmp_path / "out").resolve() / "artifacts" if inside else None)
