"""Code that runs in two places: in this package on the controller, and in gpuenv's Ansible modules
on the hosts, which import it as ansible.module_utils.<name> (ansible.cfg's module_utils names this
folder beside plugins/module_utils). Standard library only, and Python 3.8's syntax: a host's
Python may be that old."""
