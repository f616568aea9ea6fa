# A module beside the training script: `import helper` finds it as a fresh `python <script>` does (sys.path[0]).
VALUE = 42
