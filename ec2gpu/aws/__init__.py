"""The AWS layer: the only package that imports boto3."""
