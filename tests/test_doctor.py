"""`xtrain doctor`: OK / MISSING / FAIL per component, exit 0 when the CPU course can run."""

import shutil

from xtrain_lessons.course import doctor


def _by_name(findings):
    return {f.component: f for f in findings}


def test_doctor_on_this_machine(capsys):
    findings = doctor.run_checks()
    code = doctor.report(findings)
    out = capsys.readouterr().out
    found = _by_name(findings)
    assert found["NumPy"].status == doctor.OK
    assert found["C++20 compiler"].status == doctor.OK
    assert found["CUDA emulator (CPU)"].status == doctor.OK, found["CUDA emulator (CPU)"].detail
    if shutil.which("nvcc"):
        assert found["nvcc"].status == doctor.OK
    for f in findings:
        assert f.status in (doctor.OK, doctor.MISSING, doctor.FAIL)
        assert f"{f.status:<8} {f.component}" in out
        if f.status != doctor.OK:
            assert f.fix, f"{f.component} has no fix line"
    assert code == 0
    assert "CPU course: ready" in out


def test_missing_required_component_fails(capsys, monkeypatch):
    monkeypatch.setattr(doctor, "find_cxx", lambda: None)
    code = doctor.report(doctor.run_checks())
    out = capsys.readouterr().out
    assert code == 1
    assert "MISSING  C++20 compiler" in out and "fix: install a C++20 compiler" in out
    assert "NOT ready" in out


def test_missing_optional_component_does_not_fail(capsys, monkeypatch):
    monkeypatch.setattr(doctor, "check_gpu", lambda: doctor.Finding(
        "GPU (CuPy)", doctor.MISSING, "no GPU", False, "optional"))
    assert doctor.report(doctor.run_checks()) == 0


def test_doctor_reports_the_precisions_of_the_device():
    f = doctor.check_precisions()
    assert f.status == doctor.OK and f.component == "precisions (cpu)"
    for dtype in ("float32", "bf16", "fp16"):
        assert dtype in f.detail
