"""How the tests check a refusal: one line on stderr, no traceback, naming what went wrong."""
from __future__ import annotations


def one_line_error(capsys, *fragments: str) -> str:
    """The captured stderr, checked to be one line without a traceback that holds every fragment."""
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err
