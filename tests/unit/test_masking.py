"""Secret values are masked by one function everywhere (issue 29, item 12)."""


def test_a_secret_inside_a_longer_one_leaves_nothing_of_either_in_logs():
    """One masking function (job_summary.mask_text) for the live log, `ec2gpu logs` and records:
    longest first, so 'abc' inside 'abcdef' does not leave 'def' readable."""
    from ec2gpu.runs import engine, logs
    line = "token abcdef and abc"
    assert logs.mask(line, ["abc", "abcdef"]) == "token **** and ****"
    job = engine.TaskJob.__new__(engine.TaskJob)
    job.secret_values = ["abc", "abcdef"]
    assert job.mask(line) == "token **** and ****"
