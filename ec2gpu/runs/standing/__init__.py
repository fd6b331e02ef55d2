"""Standing instances (`ec2gpu launch`): jobs on them (`exec`, `train mnist --cluster`), `stop` and
`start`, and `ec2gpu notebook`."""
