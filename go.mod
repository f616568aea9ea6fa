module github.com/elastic-training/elastic-training

go 1.26
