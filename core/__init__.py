# core
