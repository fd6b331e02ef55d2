"""ec2gpu: rent a GPU on AWS EC2 for exactly as long as a training job needs it."""

__version__ = "0.1.0"
