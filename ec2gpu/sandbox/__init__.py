"""The sandbox: moto's AWS server plus one real sshd per instance, on loopback."""
