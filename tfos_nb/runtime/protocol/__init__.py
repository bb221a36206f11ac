"""What crosses a process boundary: control messages, the signed control channel, data frames."""
