"""CI and lint helpers: what `make lint`, `make synth`, `make diff` and the workflows run to check
the code and the synthesized templates (complexity gate, actionlint, checkov, cfn-guard/cdk-nag
summary, infrastructure diff, the runner's disk). Not shipped in any image and not an operator
command; run each as `python -m checks.<name>` (actionlint.cjs with node, free-runner-disk.sh as a
script on a CI runner). Product code and tools/ never import from here.
"""
