CREATE DATABASE sailor OWNER airflow;
