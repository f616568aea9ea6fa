module elastic-training/e2e-pause

go 1.22
