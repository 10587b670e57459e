"""Files the Slurm controller runs: ``job_submit.lua`` and the prolog/epilog ``kelvin-notify.sh``.

``kelvin slurm files --dir /etc/slurm ...`` writes them with a site's values filled in.
"""
