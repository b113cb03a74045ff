"""gpuenv's test bench: the sandbox fleet (systemd-nspawn hosts, the mirror, NVIDIA's apt
repository and the conda channel it serves) and the test suite's lanes. Not part of the installed
package: scripts/setup puts the repository on the virtual environment's path."""
