"""Bad input gets one line on stderr, `error: ...`, and a non-zero exit code, never a traceback."""


def assert_one_line_error(proc, *fragments, exit_code: int | None = None):
    """`proc` (a finished subprocess) failed with exactly one `error:` line holding every
    fragment; with exit_code, that exact exit code."""
    if exit_code is None:
        assert proc.returncode != 0, proc.stderr
    else:
        assert proc.returncode == exit_code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
