"""V732: a prompt file (data.prompt_data, eval.datasets[].prompt_data) that is not where the
driver will look is said at plan time, like a missing model folder (V730), and is an error
with its position (exit 1) for `vime submit --local`, which runs the job on this machine."""

from __future__ import annotations

from specsupport import ROOT, run_text

from vime.cli import main

TINY = ROOT / "specs" / "tiny_cpu.toml"
PROMPTS = ROOT / "specs" / "data" / "tiny_arithmetic.jsonl"


def _spec(folder, *, prompt_data: str, eval_prompt_data: str | None = None):
    text = TINY.read_text().replace('prompt_data = "data/tiny_arithmetic.jsonl"  # relative',
                                    f'prompt_data = "{prompt_data}"  # relative', 1)
    text = text.replace('prompt_data = "data/tiny_arithmetic.jsonl"',
                        f'prompt_data = "{eval_prompt_data or PROMPTS}"')
    spec = folder / "spec.toml"
    spec.write_text(text)
    return spec


def _v732(diagnostics):
    return [d for d in diagnostics if d.code == "V732"]


def test_a_relative_prompt_file_in_neither_folder_is_a_warning_at_its_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = _spec(tmp_path, prompt_data="data/absent.jsonl")
    result = run_text(spec.read_text(), name=str(spec), spec_dir=tmp_path)
    [diag] = _v732(result.diagnostics)
    assert diag.severity == "warning" and diag.key == "data.prompt_data"
    assert diag.location.file == str(spec) and diag.location.line == 47
    assert diag.message == ("data.prompt_data = 'data/absent.jsonl' is a file neither beside "
                            "the spec nor in the folder vime runs in, where the driver reads a "
                            "relative path from")
    assert result.ok  # a warning: plan and compile go on


def test_an_absolute_prompt_file_not_here_is_a_warning(tmp_path):
    spec = _spec(tmp_path, prompt_data=str(tmp_path / "absent.jsonl"))
    [diag] = _v732(run_text(spec.read_text(), spec_dir=tmp_path).diagnostics)
    assert diag.severity == "warning" and "the job's nodes must have it" in diag.message


def test_an_eval_datasets_missing_file_is_pointed_at(tmp_path):
    spec = _spec(tmp_path, prompt_data=str(PROMPTS), eval_prompt_data="held_out.jsonl")
    [diag] = _v732(run_text(spec.read_text(), spec_dir=tmp_path).diagnostics)
    assert diag.key == "eval.datasets[0].prompt_data" and diag.location.line == 97


def test_submit_local_stops_on_a_missing_prompt_file_with_exit_1_and_its_position(
        tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for prompt_data, eval_prompt_data, line in (("absent.jsonl", None, 47),
                                                (str(PROMPTS), "absent.jsonl", 97)):
        spec = _spec(tmp_path, prompt_data=prompt_data, eval_prompt_data=eval_prompt_data)
        code = main(["submit", str(spec), "--local", "--set",
                     f'experiment.output_dir="{tmp_path}/out"', "--format", "concise"])
        err = capsys.readouterr().err
        assert code == 1, err
        [said] = [line for line in err.splitlines() if "V732" in line]
        assert said.startswith(f"{spec}:{line}:1: error[V732] ")
        assert "`vime submit --local` runs the job on this machine" in said
        assert "vime: error:" not in err
    assert not (tmp_path / "out").exists()


def test_a_prompt_file_that_is_there_is_clean(tmp_path):
    spec = _spec(tmp_path, prompt_data=str(PROMPTS))
    assert not _v732(run_text(spec.read_text(), spec_dir=tmp_path).diagnostics)
