"""The progress line `vime submit` and `vime logs -f` print for each rollout
(vime/launch/progress.py), read from metrics.jsonl records as the loop writes them."""

from __future__ import annotations

from vime.launch.progress import Progress, rollout_line, sampling_parts


def test_a_dynamic_sampling_rollout_line_shows_kept_and_filtered_groups():
    record = {"rollout": 3, "reward/mean": 0.25, "response_len/mean": 12.0,
              "throughput/generate_tokens_per_s": 80, "time/generate": 1.5,
              "rollout/groups_kept": 3, "rollout/groups_filtered": 5, "rollout/empty_streak": 0}
    line = rollout_line(record, 10, None)
    assert "len 12.0 | 80 tok/s | groups kept 3 filtered 5 | gen 1.50 s | ETA -" in line


def test_a_rollout_that_kept_no_group_says_it_in_the_progress_line(tmp_path):
    (tmp_path / "logs").mkdir()
    record = ('{"rollout": 4, "reward/mean": 0.0, "rollout/groups_kept": 0, '
              '"rollout/groups_filtered": 16, "rollout/empty_streak": 2}\n')
    (tmp_path / "metrics.jsonl").write_text(record)
    (tmp_path / "logs" / "node-0.log").write_text("rollout     4 | reward 0.000\n")
    seen: list[str] = []
    progress = Progress(tmp_path, 10, started=0.0)
    progress.say = seen.append
    progress.poll()
    assert len(seen) == 1
    assert "| groups kept 0 filtered 16 NO GROUP KEPT (2 in a row) |" in seen[0]


def test_a_run_without_dynamic_sampling_has_no_group_words():
    assert sampling_parts({"reward/mean": 0.5}) == []
    assert "groups" not in rollout_line({"rollout": 0, "reward/mean": 0.5}, 2, 1.0)
